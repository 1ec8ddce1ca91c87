# The two set-up commands of the README:
#   make demo   venv + pinned stack, provision the embedded one-machine cluster, run a job on it
#   make test   venv + pinned stack, lint, pytest (unit + integration), molecule default
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: venv demo up down status test lint pytest molecule clean

$(VENV)/.stack-installed: pyproject.toml constraints/cpu.txt scripts/install-stack.sh
	scripts/install-stack.sh $(VENV)
	touch $@

venv: $(VENV)/.stack-installed

demo: venv
	ansible-playbook -i inventory site.yml
	rlrun status
	rlrun submit --follow --no-working-dir -- python -c \
	  "import ray; ray.init(); print('cluster resources:', ray.cluster_resources())"

up: venv
	rlrun up

down: venv
	rlrun down

status: venv
	rlrun status

test: venv lint pytest molecule

lint: venv
	ruff check .
	yamllint -s .
	ansible-lint --profile production --offline

# pytest exits 5 when it collects nothing: that fails `make test`, as it must.
pytest: venv
	python -m pytest -ra

molecule: venv
	molecule test -s default

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache
