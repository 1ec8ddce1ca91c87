"""Rule-based math rewards: answer extraction, math-verify comparison, a timeout-safe process pool.

One package, torch-free, shared by the job and the separately deployed service:

* ``extract``, ``forms``, ``math``, ``guard``: pure functions (what an answer is, which spellings mean the
  same, whether it is right);
* ``pool``: worker processes with a per-item budget (used by the service and ``--reward_fn math_verify``);
* ``client``: the job's HTTP client of the service; ``local``: in-job reward functions;
* ``server``: the service itself, ``python -m trainer.reward.server`` (Flask under gunicorn).

In-process (no timeout)::

    from trainer.reward import score_response
    score_response(r"... so the answer is \\boxed{1/2}", "0.5").score  # 1.0

Bounded by a per-item timeout, in worker processes::

    from trainer.reward import VerifyPool
    with VerifyPool(timeout=3.0) as pool:
        results = pool.score(responses, labels)
"""

from trainer.reward.extract import DEFAULT_STRATEGIES, STRATEGIES, extract_answer
from trainer.reward.math import (
    MathRewardConfig,
    Reason,
    RewardResult,
    fast_compare,
    label_to_str,
    score_response,
    verify_answer,
)
from trainer.reward.pool import VerifyPool, default_processes

__all__ = [
    "DEFAULT_STRATEGIES",
    "STRATEGIES",
    "MathRewardConfig",
    "Reason",
    "RewardResult",
    "VerifyPool",
    "default_processes",
    "extract_answer",
    "fast_compare",
    "label_to_str",
    "score_response",
    "verify_answer",
]
