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
from pathlib import Path

from rlrun.errors import RlrunError
from rlrun.inventory import Cluster

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


def _excluded(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    return any(fnmatch.fnmatch(part, pat) for part in parts for pat in patterns) or any(
        fnmatch.fnmatch(rel, pat) for pat in patterns)


def upload_size(working_dir: Path, excludes: list[str]) -> tuple[int, list[tuple[int, str]]]:
    """Bytes that would be uploaded, and the largest files among them."""
    total, files = 0, []
    for root, dirs, names in os.walk(working_dir):
        rel_root = os.path.relpath(root, working_dir)
        dirs[:] = [d for d in dirs if not _excluded(os.path.normpath(os.path.join(rel_root, d)), excludes)]
        for name in names:
            rel = os.path.normpath(os.path.join(rel_root, name))
            if _excluded(rel, excludes):
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


class Jobs:
    """The Jobs API of one cluster."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.url = cluster.dashboard_url
        headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.auth_enabled else None
        from ray.job_submission import JobSubmissionClient

        with self._errors():
            self.client = JobSubmissionClient(self.url, headers=headers)

    @contextlib.contextmanager
    def _errors(self, job_id: str | None = None) -> Iterator[None]:
        """Turn the SDK's exceptions into one line that names the cluster and the cause."""
        from ray.exceptions import AuthenticationError

        try:
            yield
        except AuthenticationError as exc:
            why = "refused the token" if "Invalid" in str(exc) or "Forbidden" in str(exc) else "wants a token"
            raise RlrunError(f"the cluster at {self.url} {why}: check the inventory's token "
                             f"({self.cluster.token_store or 'cluster__token'})") from None
        except ConnectionError:
            raise RlrunError(f"cannot reach the Ray Jobs API at {self.url}: is the cluster up? "
                             f"(`rlrun up`, `rlrun status`)") from None
        except RuntimeError as exc:
            if job_id and ("404" in str(exc) or "does not exist" in str(exc)):
                raise RlrunError(f"no job '{job_id}' on the cluster at {self.url} (see `rlrun list`)") from None
            raise RlrunError(f"the Jobs API at {self.url} failed: {exc}") from None

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

    def logs(self, job_id: str) -> str:
        with self._errors(job_id):
            return self.client.get_job_logs(job_id)

    def stop(self, job_id: str) -> bool:
        with self._errors(job_id):
            return self.client.stop_job(job_id)

    def follow(self, job_id: str, write=print) -> str:
        """Stream the job's logs until it ends; return its final status."""

        async def tail() -> None:
            async for chunk in self.client.tail_job_logs(job_id):
                write(chunk)

        with self._errors(job_id):
            self.client.get_job_status(job_id)
            asyncio.run(tail())
            # The log stream closes when the job ends; the status may lag a moment.
            for _ in range(50):
                status = self.status(job_id)
                if status in TERMINAL:
                    return status
                time.sleep(0.2)
            return self.status(job_id)
