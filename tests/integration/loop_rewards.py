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


def half_constant(queries, prompts=None, labels=None):
    """A task where about half the prompts carry no gradient: a prompt whose answer ends in an even digit
    scores 0.5 for every sample; the others score as has_one (which varies between samples)."""
    responses = [q[len(p):] for q, p in zip(queries, prompts, strict=True)]
    return RewardBatch([0.5 if str(label)[-1:] in "02468" else 1.0 if "1" in r else 0.0
                        for r, label in zip(responses, labels, strict=True)])
