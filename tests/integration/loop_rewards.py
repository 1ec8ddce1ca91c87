"""Reward functions for the training-loop tests (loaded by `--reward_fn tests.integration.loop_rewards:NAME`)."""

from trainer.reward.client import RewardBatch


def has_one(queries, prompts=None, labels=None):
    """1.0 when the response contains the character '1': a random tiny model hits it sometimes."""
    responses = [q[len(p):] for q, p in zip(queries, prompts, strict=True)]
    return RewardBatch([1.0 if "1" in r else 0.0 for r in responses])



def char_mean(queries, prompts=None, labels=None):
    """The mean character code of the response / 128: differs between almost any two responses, even a
    random model's, so every group has non-zero advantages and the policy moves from the first step on."""
    responses = [q[len(p):] for q, p in zip(queries, prompts, strict=True)]
    return RewardBatch([sum(map(ord, r)) / max(len(r), 1) / 128 for r in responses])
