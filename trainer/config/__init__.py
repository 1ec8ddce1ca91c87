"""The trainer's configuration: one typed, validated object built from OpenRLHF-style flags.

Modules, each importing only those above it (no import circles)::

    errors      ConfigError and the "did you mean" hint
    fields      the flag machinery: one dataclass field = one flag (types, bounds, help groups)
    estimators  what each --advantage_estimator needs and does (critic, group baseline, whitening)
    rules       auto values, the cross-field rules and the derived sizes (which models exist: once)
    schema      TrainerConfig: the flag table itself
    cli         the argparse parser built from TrainerConfig's fields

Torch-free: ``--print-config`` and rlrun's pre-submit checks import it without Ray, DeepSpeed or torch.
"""

from trainer.config.errors import ConfigError, unknown_name_problem
from trainer.config.rules import TENSORBOARD_AUTO, compile_conflict
from trainer.config.schema import (
    CUDA_ONLY_FLAGS,
    CUDAGRAPH_MODES,
    REDACTED,
    VLLM_COMPILE_MODES,
    WANDB_FROM_ENV,
    AdvantageEstimator,
    KlEstimator,
    TrainerConfig,
)

__all__ = [
    "CUDA_ONLY_FLAGS", "CUDAGRAPH_MODES", "REDACTED", "TENSORBOARD_AUTO", "VLLM_COMPILE_MODES", "WANDB_FROM_ENV", "AdvantageEstimator", "ConfigError", "KlEstimator",
    "TrainerConfig", "compile_conflict", "unknown_name_problem",
]  # fmt: skip
