"""Jobs on a cluster through Ray's Jobs API (JobSubmissionClient), with the
cluster token, runtime_env hygiene and one clear error per failure."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import shlex
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from rlrun.errors import RlrunError
from rlrun.inventory import Cluster
from trainer.metrics import parse_log_line

# Never uploaded with working_dir: VCS data, environments, checkpoints, data
# sets, caches, secrets. Jobs read data and models from paths on the nodes.
DEFAULT_EXCLUDES = [
    ".git", ".venv", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".secrets",
    "ckpts", "ckpt", "checkpoints", "data", "datasets", "wandb", "runs", "tensorboard",
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.parquet", "build", "dist", ".whl",
]
# Ray refuses working_dir uploads above 100 MiB; refuse earlier, with the culprits named.
MAX_UPLOAD_BYTES = 90 * 1024 * 1024
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def excluded(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    return any(fnmatch.fnmatch(part, pat) for part in parts for pat in patterns) or any(
        fnmatch.fnmatch(rel, pat) for pat in patterns)


def upload_size(working_dir: Path, excludes: list[str]) -> tuple[int, list[tuple[int, str]]]:
    """Bytes that would be uploaded, and the largest files among them."""
    total, files = 0, []
    for root, dirs, names in os.walk(working_dir):
        rel_root = os.path.relpath(root, working_dir)
        dirs[:] = [d for d in dirs if not excluded(os.path.normpath(os.path.join(rel_root, d)), excludes)]
        for name in names:
            rel = os.path.normpath(os.path.join(rel_root, name))
            if excluded(rel, excludes):
                continue
            with contextlib.suppress(OSError):
                size = os.path.getsize(os.path.join(root, name))
                total += size
                files.append((size, rel))
    return total, sorted(files, reverse=True)[:5]


def build_runtime_env(working_dir: Path | None, env_vars: dict[str, str], excludes: list[str]) -> dict:
    """runtime_env for a submission; refuses an upload Ray would refuse, naming the largest files."""
    runtime_env: dict = {}
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    if working_dir is not None:
        if not working_dir.is_dir():
            raise RlrunError(f"--working-dir {working_dir} is not a directory")
        all_excludes = DEFAULT_EXCLUDES + list(excludes)
        size, largest = upload_size(working_dir, all_excludes)
        if size > MAX_UPLOAD_BYTES:
            biggest = ", ".join(f"{rel} ({n / 2**20:.1f} MiB)" for n, rel in largest)
            raise RlrunError(f"working dir {working_dir} would upload {size / 2**20:.0f} MiB, over the "
                             f"{MAX_UPLOAD_BYTES // 2**20} MiB limit; largest: {biggest}. Exclude them "
                             "with --exclude PATTERN or keep data on the nodes")
        runtime_env["working_dir"] = str(working_dir)
        runtime_env["excludes"] = all_excludes
    return runtime_env


DEFAULT_TIMEOUT = 30.0


def short_message(message: str | None) -> str:
    """Ray's job message without the log it appends on failure ("..., last available logs (truncated to
    20,000 chars): <log>"): rlrun shows the log's tail once, itself."""
    if not message:
        return ""
    cut = message.find(", last available logs")
    return (message[:cut] if cut >= 0 else message).strip()


def log_tail(text: str, lines: int) -> str:
    """The last `lines` lines of a log (all of it for lines <= 0)."""
    if lines <= 0:
        return text
    kept = text.splitlines(keepends=True)[-lines:]
    return "".join(kept)


@dataclass
class JobRow:
    """One line of `rlrun list`: a submitted job or a driver that connected by itself."""

    job_id: str  # the submission id, else Ray's driver job id: what `rlrun status/logs/stop` take
    kind: str  # SUBMISSION | DRIVER
    status: str
    name: str  # the preset, the --name given at submit, else the start of the entrypoint
    preset: str | None
    start_time: int | None  # ms since the epoch
    end_time: int | None
    entrypoint: str
    message: str
    ray_job_id: str | None = None
    step: int | None = None
    total_steps: int | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from start to end (to now while it runs)."""
        if not self.start_time:
            return None
        end = self.end_time or (time.time() * 1000 if self.status not in TERMINAL else self.start_time)
        return max(0.0, (end - self.start_time) / 1000)

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "type": self.kind, "status": self.status, "name": self.name,
                "preset": self.preset, "submission_id": self.job_id if self.kind == "SUBMISSION" else None,
                "ray_job_id": self.ray_job_id, "step": self.step, "total_steps": self.total_steps,
                "start_time": self.start_time, "end_time": self.end_time, "duration_s": self.duration,
                "entrypoint": self.entrypoint, "message": self.message}


def progress_of(log: str) -> tuple[int | None, int | None]:
    """(last step, total steps) from a trainer job's @metrics / @plan lines; (None, None) for other jobs."""
    step = total = None
    for line in log.splitlines():
        if not line.startswith("@"):
            continue
        parsed = parse_log_line(line)
        if parsed is None:
            continue
        kind, payload = parsed
        if kind == "plan" and isinstance(payload.get("total_steps"), int):
            total = payload["total_steps"]
        elif kind == "metrics" and isinstance(payload.get("step"), int):
            step = payload["step"]
    return step, total


def row_of(job) -> JobRow:
    """A JobRow from the SDK's JobDetails."""
    meta = job.metadata or {}
    kind = str(getattr(job.type, "value", job.type) or "SUBMISSION").upper()
    job_id = job.submission_id or job.job_id or "-"
    entry = job.entrypoint or ""
    preset = meta.get("preset") or None
    name = preset or meta.get("name") or _short(entry)
    return JobRow(job_id=job_id, kind=kind, status=str(job.status.value), name=name or "-", preset=preset,
                  start_time=job.start_time or None, end_time=job.end_time or None, entrypoint=entry,
                  message=short_message(job.message), ray_job_id=job.job_id)


def _short(entrypoint: str) -> str:
    """The first words of an entrypoint, as a name for a job submitted without one."""
    try:
        words = shlex.split(entrypoint)
    except ValueError:
        words = entrypoint.split()
    return " ".join(words[:3])[:40]


class _Client:
    """Ray's JobSubmissionClient with a timeout on every request (the SDK sets none: a head that accepts
    connections and never answers would hang it forever)."""

    @staticmethod
    def make(url: str, headers: dict | None, timeout: float):
        # Ray takes ~1 s to import: only the commands that talk to the Jobs API pay it, not `rlrun --help`
        from ray.job_submission import JobSubmissionClient

        class Client(JobSubmissionClient):
            def _do_request(self, method, endpoint, **kwargs):
                kwargs.setdefault("timeout", (timeout, timeout))
                return super()._do_request(method, endpoint, **kwargs)

        return Client(url, headers=headers)


class Jobs:
    """The Jobs API of one cluster; every call waits at most `timeout` seconds for an answer."""

    def __init__(self, cluster: Cluster, timeout: float = DEFAULT_TIMEOUT):
        self.cluster = cluster
        self.url = cluster.dashboard_url
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.auth_enabled else {}
        with self._errors():
            self.client = _Client.make(self.url, self.headers or None, timeout)

    @contextlib.contextmanager
    def _errors(self, job_id: str | None = None) -> Iterator[None]:
        """Turn the SDK's exceptions into one line that names the cluster and the cause."""
        from ray.exceptions import AuthenticationError  # loaded by make() already; not at start (~1 s)

        try:
            yield
        except AuthenticationError as exc:
            why = "refused the token" if "Invalid" in str(exc) or "Forbidden" in str(exc) else "wants a token"
            raise RlrunError(f"the cluster at {self.url} {why}: check the inventory's token "
                             f"({self.cluster.token_store or 'cluster__token'})") from None
        except (requests.Timeout, TimeoutError, asyncio.TimeoutError):
            raise RlrunError(f"the Ray Jobs API at {self.url} did not answer within {self.timeout:g} s "
                             "(is the head overloaded or hung? --timeout SECONDS waits longer)") from None
        except (ConnectionError, requests.ConnectionError):
            raise RlrunError(f"cannot reach the Ray Jobs API at {self.url}: is the cluster up? "
                             f"(`rlrun up`, `rlrun status`)") from None
        except RuntimeError as exc:
            if job_id and ("404" in str(exc) or "does not exist" in str(exc)):
                raise RlrunError(f"no job '{job_id}' on the cluster at {self.url} (see `rlrun list`)") from None
            raise RlrunError(f"the Jobs API at {self.url} failed: {' '.join(str(exc).split())[:300]}") from None

    def submit(self, entrypoint: list[str], runtime_env: dict, submission_id: str | None = None,
               num_cpus: float = 0, num_gpus: float = 0, metadata: dict | None = None) -> str:
        if not entrypoint:
            raise RlrunError("no entrypoint: give the command after `--`, e.g. rlrun submit -- python -c 'print(42)'")
        job_id = submission_id or f"rlrun-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        with self._errors():
            return self.client.submit_job(
                entrypoint=shlex.join(entrypoint), submission_id=job_id, runtime_env=runtime_env,
                entrypoint_num_cpus=num_cpus, entrypoint_num_gpus=num_gpus,
                metadata={"submitted_by": "rlrun", **(metadata or {})})

    def status(self, job_id: str) -> str:
        with self._errors(job_id):
            return str(self.client.get_job_status(job_id).value)

    def info(self, job_id: str):
        with self._errors(job_id):
            return self.client.get_job_info(job_id)

    def list(self) -> list:
        with self._errors():
            return sorted(self.client.list_jobs(), key=lambda j: j.start_time or 0)

    def rows(self) -> list[JobRow]:
        """Every job as a JobRow, oldest first."""
        return [row_of(j) for j in self.list()]

    def add_progress(self, rows: list[JobRow]) -> None:
        """Fill in the last step of trainer jobs, read from their logs (a log that cannot be read: no step)."""
        for row in rows:
            if row.kind == "SUBMISSION" and row.job_id != "-":
                with contextlib.suppress(RlrunError):
                    row.step, row.total_steps = progress_of(self.logs(row.job_id))

    def logs(self, job_id: str) -> str:
        with self._errors(job_id):
            return self.client.get_job_logs(job_id)

    def stop(self, job_id: str) -> bool:
        with self._errors(job_id):
            return self.client.stop_job(job_id)

    async def _tail(self, job_id: str, write) -> None:
        """Ray's log tail (the dashboard's websocket). A quiet stream is not a hung head: after `timeout`
        seconds without a line the head is asked for the job's status (with the same timeout), and only a
        head that does not answer that ends the follow. A job may print nothing for minutes."""
        import aiohttp  # ~3x the import time of requests, and only following a log needs it

        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_connect=self.timeout)
        async with aiohttp.ClientSession(headers=self.headers, timeout=timeout) as session:
            try:
                ws = await asyncio.wait_for(session.ws_connect(
                    f"{self.url}/api/jobs/{job_id}/logs/tail",
                    # leaving does not wait for a hung head's close handshake
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=1.0)), self.timeout)
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 404:
                    raise RuntimeError(f"job {job_id} does not exist") from None
                raise RuntimeError(f"log tail refused: HTTP {exc.status}") from None
            except aiohttp.ClientConnectionError as exc:
                raise ConnectionError(str(exc)) from None
            async with ws:
                reading = None
                try:
                    while True:
                        reading = reading or asyncio.ensure_future(ws.receive())
                        done, _ = await asyncio.wait({reading}, timeout=self.timeout)
                        if not done:  # quiet for `timeout` s: is the head still there? (raises when it is not)
                            await asyncio.to_thread(self.status, job_id)
                            continue
                        msg, reading = reading.result(), None
                        if msg.type == aiohttp.WSMsgType.TEXT:
                            write(msg.data)
                        elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                                          aiohttp.WSMsgType.CLOSED):
                            if ws.close_code == aiohttp.WSCloseCode.ABNORMAL_CLOSURE:
                                raise ConnectionError("the log stream broke off")
                            return
                        elif msg.type == aiohttp.WSMsgType.ERROR:
                            raise RuntimeError(f"log stream of job {job_id} failed: {ws.exception()}")
                finally:
                    if reading is not None:
                        reading.cancel()

    def follow(self, job_id: str, write=print) -> str:
        """Stream the job's logs until it ends; return its final status."""
        with self._errors(job_id):
            self.client.get_job_status(job_id)
            asyncio.run(self._tail(job_id, write))
            # The log stream closes when the job ends; the status may lag a moment.
            for _ in range(50):
                status = self.status(job_id)
                if status in TERMINAL:
                    return status
                time.sleep(0.2)
            return self.status(job_id)
