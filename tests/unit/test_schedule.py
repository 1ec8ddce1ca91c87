import math

import pytest

from trainer.schedule import learning_rate


def test_cosine_warms_up_linearly_then_decays_to_a_tenth():
    # total 10, warm-up ceil(10 * 0.2) = 2 steps: 0.5, 1.0; then cosine over steps 2..9
    rates = [learning_rate(1.0, s, 10, 0.2) for s in range(10)]
    assert rates[:2] == [0.5, 1.0]
    assert rates[2] == pytest.approx(1.0)
    assert rates[-1] == pytest.approx(0.1)
    mid = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (5.5 - 2) / 7))
    assert (rates[5] + rates[6]) / 2 == pytest.approx(mid, rel=0.05)
    assert all(a >= b for a, b in zip(rates[1:], rates[2:], strict=False))


def test_constant_with_warmup_and_no_warmup():
    assert [learning_rate(2.0, s, 4, 0.5, "constant_with_warmup") for s in range(4)] == [1.0, 2.0, 2.0, 2.0]
    assert learning_rate(2.0, 0, 4, 0.0, "constant_with_warmup") == 2.0


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown lr schedule 'linear': expected one of cosine_with_min_lr"):
        learning_rate(1.0, 0, 10, 0.0, "linear")
