"""The retrieval service on this machine for the length of a ``with`` block: index built, served on a free
loopback port, waited for, stopped by its PID.

The benchmarks (bench/tool_curve.py, bench/multiturn.py) and the multi-turn tests each started it the same
way; a cluster gets it from the ``retriever`` role instead.

    with local_service(corpus, work) as svc:          # svc.url: http://127.0.0.1:PORT/retrieve
        ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LocalService:
    """A running service: its port, ``/retrieve`` URL, PID and log file."""

    port: int
    url: str
    pid: int
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


@contextlib.contextmanager
def local_service(corpus: str | os.PathLike, work: str | os.PathLike, *, token_file: str | os.PathLike | None = None,
                  timeout: float = 120.0) -> Iterator[LocalService]:  # fmt: skip
    """Build the index of ``corpus`` under ``work/index``, serve it on 127.0.0.1 (``token_file``: the token
    clients must send; none: the service's own default), wait for ``/health_check`` and yield the service;
    stopped (SIGTERM to its process group, SIGKILL after 20 s) when the block ends. Raises RuntimeError naming
    the log's end where the build fails or the service does not answer within ``timeout`` seconds."""
    import requests

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH")) if p)}
    build = subprocess.run([sys.executable, "-m", "trainer.retrieval", "build", "--corpus", str(corpus),
                            "--out", str(work / "index")], capture_output=True, text=True, env=env, cwd=PROJECT,
                           timeout=600)  # fmt: skip
    if build.returncode != 0:
        raise RuntimeError(f"the retrieval index of {corpus} was not built: {build.stderr.strip()[-2000:]}")
    port = _free_port()
    log = work / "retriever.log"
    command = [sys.executable, "-m", "trainer.retrieval", "serve", "--index", str(work / "index"),
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if token_file is not None:
        command += ["--token-file", str(token_file)]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PROJECT,
                                  start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                if requests.get(f"http://127.0.0.1:{port}/health_check", timeout=5).ok:
                    break
            if server.poll() is not None:
                raise RuntimeError(f"the retrieval service exited ({server.returncode}): {_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the retrieval service did not answer within {timeout:g} s: {_tail(log)}")
            time.sleep(0.5)
        yield LocalService(port=port, url=f"http://127.0.0.1:{port}/retrieve", pid=server.pid, log=log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)  # gunicorn's master and its workers: the group it leads
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()
