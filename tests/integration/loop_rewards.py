"""Reward functions for the training-loop tests (loaded by `--reward_fn tests.integration.loop_rewards:NAME`)."""

from trainer.reward.client import RewardBatch


def has_one(queries, prompts=None, labels=None):
    """1.0 when the response contains the character '1': a random tiny model hits it sometimes."""
    responses = [q[len(p):] for q, p in zip(queries, prompts, strict=True)]
    return RewardBatch([1.0 if "1" in r else 0.0 for r in responses])
