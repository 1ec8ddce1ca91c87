"""Rollout: the engines that generate, and everything the trainer asks of them.

- the engines: the interface (:mod:`.engine`), vLLM (:mod:`.vllm_engine`, its version differences in
  :mod:`.vllm_compat`) and HF generate (:mod:`.hf_engine`); the job's engines as Ray actors, their faults and
  replacements (:mod:`.engines`);
- the multi-turn loop with tools, run inside each engine's process (:mod:`.multiturn`; the tools:
  :mod:`trainer.tools`);
- the rollout producer, now or ahead of training: draw, generate, score, dynamic sampling (:mod:`.producer`);
- evaluation's generation and pass@k (:mod:`.evaluate`).

The engines import vLLM / transformers when they are used; nothing is imported here.
"""
