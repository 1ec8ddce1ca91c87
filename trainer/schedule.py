"""Learning-rate schedules (pure functions; the trainer sets the rate before each optimizer step).

As OpenRLHF: ``cosine_with_min_lr`` (the default) warms up linearly over ``ceil(total *
warmup_ratio)`` steps, then follows a cosine from the base rate down to 10 % of it at the last step;
``constant_with_warmup`` stays at the base rate after the warm-up.
"""

from __future__ import annotations

import math

SCHEDULES = ("cosine_with_min_lr", "constant_with_warmup")
MIN_LR_RATIO = 0.1


def learning_rate(base: float, step: int, total: int, warmup_ratio: float, kind: str = "cosine_with_min_lr") -> float:
    """The rate of optimizer step ``step`` (0-based) of ``total``."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {kind!r}: expected one of {', '.join(SCHEDULES)}")
    warmup = math.ceil(total * warmup_ratio)
    if step < warmup:
        return base * (step + 1) / warmup
    if kind == "constant_with_warmup":
        return base
    progress = min(1.0, (step - warmup) / max(1, total - warmup - 1))
    low = base * MIN_LR_RATIO
    return low + (base - low) * 0.5 * (1.0 + math.cos(math.pi * progress))
