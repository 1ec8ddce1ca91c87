# The two set-up commands of the README:
#   make demo   venv + pinned stack, provision the embedded one-machine cluster, run a job on it
#   make test   venv + pinned stack, lint, pytest (unit + integration), molecule default + multinode
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: venv demo up down status test check system-deps lint pytest molecule clean

$(VENV)/.stack-installed: pyproject.toml constraints/cpu.txt scripts/install-stack.sh
	scripts/install-stack.sh $(VENV)
	touch $@

venv: $(VENV)/.stack-installed

# The embedded default job: preset tiny-rloo (rlrun/presets/tiny-rloo.yaml). `rlrun submit` makes a
# tiny random-init model and toy prompts under build/tiny (no model hub), checks the job against the
# live cluster, submits it and follows it: a supervised warm-up of the answer format, then RLOO rewarded
# by the deployed reward service; it ends with the reward curve.
demo: venv
	ansible-playbook -i inventory site.yml
	rlrun status
	rlrun submit --preset tiny-rloo --follow

up: venv
	rlrun up

down: venv
	rlrun down

status: venv
	rlrun status

# System packages first (scripts/system-deps.sh installs what is missing as
# root, else stops at once with the install line), so no scenario is skipped.
test: system-deps venv lint pytest molecule

system-deps:
	scripts/system-deps.sh

lint: venv
	ruff check .
	yamllint -s .
	ansible-lint --profile production --offline

# pytest exits 5 when it collects nothing: that fails `make test`, as it must.
# In-process vLLM tests run in a second process (see pyproject's vllm_inproc marker).
pytest: venv
	python -m pytest -ra
	python -m pytest -ra -m vllm_inproc tests/integration/test_vllm_engine.py

# multinode: 4 hosts made of network namespaces on this machine (needs root,
# iproute2 and openssh-server; .ci/run installs them), converged over SSH.
molecule: venv
	molecule test -s default
	molecule test -s multinode

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache
