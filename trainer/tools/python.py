"""The Python tool (code-interpreter RL, as ToRL and ReTool train it): ``<python>print(123 * 456)</python>`` runs
in a fresh sandbox (:mod:`trainer.tools.sandbox`: no network, nothing writable but its own tmpfs, CPU / memory /
process / output / wall-time limits) and what it printed comes back as ``\\n<output>\\n56088\\n</output>\\n``.

Every run is a new process: nothing carries over from one call to the next. The calls of a batch run
``python_parallel`` at a time. What the model reads: the output (stdout and stderr as a terminal shows them,
a traceback included); ``[no output]`` when there is none; and a line saying why it was stopped when it was
(``error: timed out after 5 s``, ``error: output cut at 8192 bytes``, ``error: CPU time limit (5 s)``,
``error: killed``). A node that cannot isolate the code ends the job with one line when the tool starts
(:class:`trainer.tools.sandbox.SandboxUnavailable`): the code never runs unsandboxed.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import textwrap
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from trainer.tools.base import Tool
from trainer.tools.sandbox import Sandbox, SandboxLimits, SandboxUnavailable, probe
from trainer.tools.toolbox import Result

SYSTEM_PYTHON = "/usr/bin/python3"


def readable_by_others(path: str) -> bool:
    """Whether ``path`` (symlinks followed) and every directory above it can be read by any user: what an
    interpreter needs to run as the sandbox's unprivileged user."""
    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & stat.S_IROTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


def default_python() -> str:
    """This process's interpreter when any user can read it and its standard library, else the system's
    ``/usr/bin/python3``: run as root, the sandbox maps its user to nobody (a venv over a Python installed under
    /root cannot run there)."""
    if os.geteuid() != 0:
        return sys.executable
    lib = os.path.dirname(os.__file__)
    if readable_by_others(sys.executable) and readable_by_others(os.path.join(lib, "os.py")):
        return sys.executable
    return SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable


class Python(Tool):
    name = "python"
    arg: ClassVar[str] = "code"
    description: ClassVar[str] = "Run Python code in a fresh sandbox (no network, no files kept); what it prints comes back."
    result_template: ClassVar[str] = "\n<output>\n{}\n</output>\n"
    timeout = None  # each run is killed at its own wall time

    def __init__(self, limits: SandboxLimits, parallel: int = 4, python: str | None = None) -> None:
        self.limits = limits
        self.parallel = parallel
        self.sandbox = Sandbox(limits, python or default_python())
        self._pool: ThreadPoolExecutor | None = None
        self._checked = False

    @classmethod
    def from_settings(cls, s: Mapping[str, Any]) -> Python:
        limits = SandboxLimits(timeout=s["python_timeout"], cpu_s=s["python_cpu_s"], memory_bytes=s["python_memory_mb"] << 20,
                        max_procs=s["python_max_procs"], max_output=s["python_max_output"],
                        disk_bytes=s["python_disk_mb"] << 20, site_packages=s["python_site_packages"])
        return cls(limits, s["python_parallel"], s["python_executable"])

    def from_tag(self, body: str) -> dict[str, Any]:
        return {self.arg: textwrap.dedent(body.strip("\n")).strip()}

    def check(self) -> str:
        """The sandbox works on this node (once; :class:`SandboxUnavailable` naming what is missing)."""
        line = probe(self.limits, self.sandbox.python)
        self._checked = True
        return line

    def call_batch(self, batch: Sequence[Mapping[str, Any]]) -> list[Result | BaseException]:
        if not self._checked:
            self.check()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="rlrun-python")
        return list(self._pool.map(self._one, batch))

    def _one(self, args: Mapping[str, Any]) -> Result:
        code = args.get(self.arg, "")
        if not isinstance(code, str) or not code.strip():
            return Result("error: no code to run", error=True)
        outcome = self.sandbox.run(code)
        lim = self.limits
        text = outcome.output.rstrip("\n")
        why = None
        if outcome.timed_out:
            why = f"timed out after {lim.timeout:g} s"
        elif outcome.truncated:
            why = f"output cut at {lim.max_output} bytes"
        elif outcome.exit_code == 128 + signal.SIGXCPU or outcome.exit_code == 128 + signal.SIGKILL:
            why = f"CPU time limit ({lim.cpu_s} s)" if outcome.exit_code == 128 + signal.SIGXCPU else "killed"
        if why is not None:
            return Result(f"{text}\nerror: {why}" if text else f"error: {why}", error=True,
                          timed_out=outcome.timed_out)
        return Result(text if text else "[no output]", error=outcome.exit_code != 0)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.sandbox.close_server()


__all__ = ["Python", "SandboxUnavailable", "default_python", "readable_by_others"]
