"""Rollout engines: the interface (:mod:`.engine`), vLLM (:mod:`.vllm_engine`) and HF generate (:mod:`.hf_engine`).

Only the interface is imported here; the engines import vLLM / transformers when they are used.
"""

from trainer.rollout.engine import RolloutEngine, Sample, Weights

__all__ = ["RolloutEngine", "Sample", "Weights"]
