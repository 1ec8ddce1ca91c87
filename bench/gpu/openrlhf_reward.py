"""OpenRLHF's form of bench.gpu.rewards:digit_share, for the side-by-side runs (``--reward.remote_url`` takes a
``.py`` file with ``reward_func(queries, prompts, labels)``): the same reward, so both systems train on the same
signal."""

import torch


def reward_func(queries, prompts, labels):
    shares = []
    for query, prompt in zip(queries, prompts, strict=True):
        response = query[len(prompt):] if query.startswith(prompt) else query
        shares.append(sum(c.isdigit() for c in response) / max(len(response), 1))
    scores = torch.tensor(shares, dtype=torch.float32)
    return {"rewards": scores, "scores": scores, "extra_logs": {}}
