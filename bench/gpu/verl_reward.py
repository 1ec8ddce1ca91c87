"""verl's form of bench.gpu.rewards:digit_share, for the side-by-side runs (``reward.custom_reward_function``
takes a file and a function ``compute_score(data_source, solution_str, ground_truth, extra_info)`` called once
per response, ``solution_str`` being the decoded response): the same function, so all three systems train on
the same signal. The project is on verl's ``PYTHONPATH`` (bench/gpu/side_by_side.py puts it there)."""

from bench.gpu.rewards import digit_share


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(digit_share([solution_str]).rewards[0])
