"""Engine-fault bookkeeping (trainer.rollout.engines): the restart counts and the one line past --max_engine_restarts,
which failures replace an engine, errors as one line, and the entry point's one-line ending
(trainer.deadlines.fault_line). The replacements themselves run in tests/integration/test_resilience.py."""

from __future__ import annotations

import pytest
import ray.exceptions

from trainer.deadlines import Fault, StartupTimeout, fault_line
from trainer.errors import one_line
from trainer.reward.client import RewardServiceError
from trainer.rollout.engines import EngineFailure, Restarts, replaceable


def test_restarts_count_per_engine_and_in_all_then_stop_with_one_line():
    r = Restarts(3, limit=2)
    r.record(0, "vLLM engine (TP 1) 0", "10.0.0.7", "died during generate: ActorDiedError: killed")
    r.record(1, "vLLM engine (TP 1) 1", "10.0.0.8", "generate did not return within 1800 s")
    r.record(0, "vLLM engine (TP 1) 0", "10.0.0.7", "died during generate: ActorDiedError: killed")
    assert (r.per_engine, r.total) == ([2, 1, 0], 3)
    with pytest.raises(EngineFailure) as info:
        r.record(0, "vLLM engine (TP 1) 0", "10.0.0.7", "died during a liveness ping: ActorDiedError: gone")
    assert str(info.value) == ("vLLM engine (TP 1) 0 on node 10.0.0.7 failed 3 times (--max_engine_restarts 2); "
                               "last error: died during a liveness ping: ActorDiedError: gone")
    assert (r.per_engine, r.total) == ([2, 1, 0], 3)  # the failure that ends the job is not a restart
    r.record(2, "vLLM engine (TP 1) 2", "10.0.0.9", "x")  # another engine still has its own allowance
    assert r.total == 4


def test_no_restart_allowed_stops_at_the_first_failure():
    r = Restarts(1, limit=0)
    with pytest.raises(EngineFailure, match=r"^HF rollout engine 0 on node \? failed 1 times \(--max_engine_restarts "
                                            r"0\); last error: generate did not return within 5 s$"):
        r.record(0, "HF rollout engine 0", "?", "generate did not return within 5 s")
    with pytest.raises(ValueError, match="at least one engine and a limit >= 0"):
        Restarts(0, 3)


def test_a_dead_actor_is_replaced_an_error_of_the_call_is_raised():
    assert replaceable(ray.exceptions.ActorDiedError())
    assert replaceable(ray.exceptions.ActorUnavailableError("unreachable", None))
    assert not replaceable(ValueError("prompts must be a list of str"))
    assert not replaceable(RewardServiceError("retrieval service http://x failed after 4 attempts: refused"))

    class EngineDeadError(RuntimeError):  # vLLM's name for an engine core that died under a live actor
        pass

    try:
        try:
            raise EngineDeadError("EngineCore encountered an issue")
        except EngineDeadError as exc:
            raise RuntimeError("generate failed") from exc
    except RuntimeError as wrapped:
        assert replaceable(wrapped)


def test_one_line_takes_the_cause_and_the_first_line():
    class Remote(Exception):
        cause = KeyError("missing")

    assert one_line(Remote("Traceback (most recent call last):\n  File ...")) == "KeyError: 'missing'"
    assert one_line(ValueError("first\n  second")) == "ValueError: first"
    assert one_line("a   b\nc") == "a b c"
    assert one_line(RuntimeError("x" * 500)).endswith("...") and len(one_line(RuntimeError("x" * 500))) == 300


def test_the_job_ends_on_the_fault_behind_an_error():
    fault = EngineFailure("vLLM engine (TP 1) 0 on node 10.0.0.7 failed 4 times (--max_engine_restarts 3); last "
                          "error: died during generate: ActorDiedError: killed")
    assert isinstance(fault, Fault) and isinstance(StartupTimeout("x"), Fault)
    assert isinstance(RewardServiceError("x"), Fault)
    try:  # the async producer re-raises its error wrapped
        try:
            raise fault
        except EngineFailure as exc:
            raise RuntimeError("the rollout producer failed: EngineFailure: ...") from exc
    except RuntimeError as wrapped:
        assert fault_line(wrapped) == str(fault)

    class RayTaskLike(Exception):  # a RayTaskError carries what the actor raised as .cause
        def __init__(self, cause):
            super().__init__("Traceback ...\n" + str(cause))
            self.cause = cause

    outage = RewardServiceError("retrieval service http://10.0.0.7:8000/retrieve failed after 9 attempts over 301 s "
                                "(--retriever_outage_timeout 300): connection refused or unreachable")
    assert fault_line(RayTaskLike(outage)) == str(outage)
    assert fault_line(RuntimeError("a bug")) is None
