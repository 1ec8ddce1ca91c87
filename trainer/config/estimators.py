"""What each advantage estimator needs and does: the one table the config rules and the math read.

Torch-free, so that ``--print-config`` and rlrun's checks can use it. ``trainer.learn.algorithms`` takes its
whitening choice from here, the config rules take the critic / group / gamma requirements from here;
nothing else spells out "gae needs a critic" or "group_norm is not whitened".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Estimator:
    """The properties of one ``--advantage_estimator``."""

    name: str
    summary: str
    critic: bool  # learns a value function: needs a critic model; --gamma / --lambd apply
    group_baseline: bool  # baseline from the other samples of the same prompt: needs n_samples_per_prompt > 1
    batch_whiten: bool  # token advantages whitened over the rollout batch (mean 0, std 1)
    any_gamma: bool  # --gamma may differ from 1 (OpenRLHF resets it to 1 for the group estimators)
    whiten_switch: bool = False  # --rloo_whiten chooses batch_whiten (OpenRLHF changed it for rloo in v0.8.5)


ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator("gae", "PPO with a critic: GAE advantages, whitened", critic=True, group_baseline=False,
                  batch_whiten=True, any_gamma=True),
        Estimator("reinforce", "REINFORCE++: the score, whitened over the batch (no per-prompt baseline)",
                  critic=False, group_baseline=False, batch_whiten=True, any_gamma=True),
        Estimator("rloo", "REINFORCE leave-one-out: score - mean of the prompt's other samples, whitened",
                  critic=False, group_baseline=True, batch_whiten=True, any_gamma=False, whiten_switch=True),
        Estimator("reinforce_baseline", "REINFORCE++-baseline: score - the prompt's mean, whitened",
                  critic=False, group_baseline=True, batch_whiten=True, any_gamma=False),
        Estimator("group_norm", "GRPO: (score - the prompt's mean) / the prompt's std", critic=False,
                  group_baseline=True, batch_whiten=False, any_gamma=False),
        Estimator("dr_grpo", "Dr. GRPO: score - the prompt's mean, no std division, not whitened",
                  critic=False, group_baseline=True, batch_whiten=False, any_gamma=False),
    )
}  # fmt: skip


def estimator(name: str) -> Estimator:
    """The :class:`Estimator` called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; expected one of {', '.join(ESTIMATORS)}") from None
