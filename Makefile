# The two set-up commands of the README:
#   make demo   venv + pinned stack, provision the embedded one-machine cluster, run a job on it
#   make test   venv + pinned stack, lint, pytest (unit + integration), molecule default + multinode
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: venv demo up down status test lint pytest molecule clean

$(VENV)/.stack-installed: pyproject.toml constraints/cpu.txt scripts/install-stack.sh
	scripts/install-stack.sh $(VENV)
	touch $@

venv: $(VENV)/.stack-installed

# The embedded default job: a tiny random-init model and toy prompts made here
# (no model hub), RLOO on the one-machine cluster, rewards from the deployed
# reward service (the job finds the cluster token on the node).
DEMO := $(abspath build/demo)
DEMO_JOB := python -m trainer.train_ppo_ray \
  --pretrain $(DEMO)/model --prompt_data $(DEMO)/data.jsonl --input_key message --label_key answer \
  --apply_chat_template --remote_rm_url http://127.0.0.2:5001/get_reward \
  --rollout_backend vllm --vllm_num_engines 1 --vllm_tensor_parallel_size 1 --enable_prefix_caching \
  --actor_num_nodes 1 --actor_num_gpus_per_node 1 --ref_num_nodes 1 --ref_num_gpus_per_node 1 \
  --advantage_estimator rloo --n_samples_per_prompt 4 --rollout_batch_size 8 --micro_rollout_batch_size 8 \
  --train_batch_size 16 --micro_train_batch_size 8 --generate_max_len 8 --prompt_max_len 64 \
  --num_episodes 1 --max_samples 32 --zero_stage 3 --actor_learning_rate 1e-3 --init_kl_coef 0.01 \
  --save_path $(DEMO)/out --ckpt_path $(DEMO)/out/ckpt

demo: venv
	ansible-playbook -i inventory site.yml
	rlrun status
	python -m trainer.tiny model $(DEMO)/model
	python -m trainer.tiny dataset $(DEMO)/data.jsonl --n 64 --kind copy
	rlrun submit --follow -- $(DEMO_JOB)

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
