"""Local reward for the GPU benchmark runs (``--reward_fn bench.gpu.rewards:digit_share``).

A random-init model writes noise, so the reward only has to vary between samples of one prompt for RLOO
to get non-zero advantages (and so a real gradient): the share of digit characters in the response.
"""

from trainer.reward.client import RewardBatch


def digit_share(queries, prompts=None, labels=None):
    responses = [q[len(p):] for q, p in zip(queries, prompts, strict=True)] if prompts else list(queries)
    return RewardBatch([sum(c.isdigit() for c in r) / max(len(r), 1) for r in responses])
