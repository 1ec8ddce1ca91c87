"""Client of the remote reward service(s): OpenRLHF's `--remote_rm_url` contract.

One or more URLs; a batch is split into contiguous chunks, one per URL, sent
concurrently. Connection errors, timeouts and 5xx answers are retried with
exponential backoff, through an outage of up to ``outage_timeout`` seconds
(``--reward_outage_timeout``); 4xx answers (bad token, bad request) are not, since
retrying cannot fix them. Every failure names the URL and the cause, and a failure
is raised, never scored: no sample gets a 0 because the service was down.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from trainer.services import token as service_token
from trainer.services.client import ServiceClient, ServiceError

TOKEN_ENV = "RLRUN_REWARD_TOKEN"
TOKEN_FILE_ENV = "RLRUN_REWARD_TOKEN_FILE"
CA_FILE_ENV = "RLRUN_REWARD_CA_FILE"


class RewardServiceError(ServiceError):
    """A reward request failed for good: the message names the URL and the cause."""


@dataclass
class RewardBatch:
    """Rewards for a batch, in request order, and the services' numeric logs (averaged per chunk size)."""

    rewards: list[float]
    extra_logs: dict[str, float] = field(default_factory=dict)


def token_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The bearer token for the reward service, from the job's environment.

    $RLRUN_REWARD_TOKEN, else the file $RLRUN_REWARD_TOKEN_FILE, which every rlrun node
    exports (the reward service's own token, roles/cluster: cluster__reward_token_file).
    Never the cluster token: a reward request must not carry a token that runs code on
    the nodes. None when neither is set.
    """
    return service_token.token_from_env("reward", TOKEN_ENV, TOKEN_FILE_ENV, RewardServiceError, environ)


def ca_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The CA certificate to check an https reward service against: $RLRUN_REWARD_CA_FILE
    (rlrun nodes export it when the cluster serves rewards over HTTPS), else None (system CAs)."""
    env = os.environ if environ is None else environ
    path = env.get(CA_FILE_ENV)
    if path and not os.path.isfile(path):
        raise RewardServiceError(f"${CA_FILE_ENV}={path}: no such file; expected the reward service's CA certificate")
    return path or None


class RemoteRewardClient(ServiceClient):
    """Scores batches on one or more reward services."""

    what = "reward service"
    error = RewardServiceError
    hints = {401: f" (no token sent: set {TOKEN_ENV}, or {TOKEN_FILE_ENV} as rlrun nodes do)",
             403: " (the token is not the reward service's: its own, not the cluster token)"}
    ca_env = CA_FILE_ENV
    outage_flag = "reward_outage_timeout"

    def __init__(self, urls: Sequence[str], token: str | None = None, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.5, ca_file: str | None = None, outage_timeout: float = 0.0):
        """``ca_file``: the CA that https services' certificates must chain to (default:
        $RLRUN_REWARD_CA_FILE, else the system's CAs); ``outage_timeout``: how long a failing service is
        waited for (retried with backoff) beyond ``retries``."""
        if not urls:
            raise ValueError("RemoteRewardClient needs at least one URL (--remote_rm_url)")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"reward URL {url!r} must start with http:// or https://")
        super().__init__(token=token, timeout=timeout, retries=retries, backoff=backoff,
                         ca_file=ca_file or ca_from_env(), outage_timeout=outage_timeout)
        self.urls = list(urls)

    def health_check(self) -> None:
        """Fail at start-up, not an hour in: every URL must answer /health_check."""
        for url in self.urls:
            self.get_health(url)

    def score(self, queries: Sequence[str], prompts: Sequence[str] | None = None,
              labels: Sequence[Any] | None = None) -> RewardBatch:
        """Rewards for `queries` (prompt + response each), in order."""
        n = len(queries)
        if n == 0:
            return RewardBatch([])
        for name, seq in (("prompts", prompts), ("labels", labels)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} items, queries has {n}")
        chunks = _split(n, len(self.urls))
        jobs = []
        for url, (lo, hi) in zip(self.urls, chunks, strict=False):
            body: dict[str, Any] = {"query": list(queries[lo:hi])}
            if prompts is not None:
                body["prompts"] = list(prompts[lo:hi])
            if labels is not None:
                body["labels"] = list(labels[lo:hi])
            jobs.append((url, body, hi - lo))
        if len(jobs) == 1:  # in this thread: its session (and kept-alive connection) serves the next batch too
            answers = [self._post(*jobs[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                answers = list(pool.map(lambda job: self._post(job[0], job[1], job[2]), jobs))
        rewards: list[float] = []
        logs: dict[str, float] = {}
        for (_, _, size), answer in zip(jobs, answers, strict=True):
            rewards.extend(answer["rewards"])
            for key, value in (answer.get("extra_logs") or {}).items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    logs[key] = logs.get(key, 0.0) + float(value) * size / n
        return RewardBatch(rewards, logs)

    def _post(self, url: str, body: dict[str, Any], size: int) -> dict[str, Any]:
        return self._checked(url, self.post(url, body), size)

    def _checked(self, url: str, resp: requests.Response, size: int) -> dict[str, Any]:
        answer = self.answer(url, resp)
        rewards = answer.get("rewards") if isinstance(answer, dict) else None
        if not isinstance(rewards, list) or len(rewards) != size:
            got = f"{len(rewards)} rewards" if isinstance(rewards, list) else f"{type(rewards).__name__}"
            raise RewardServiceError(f"reward service {url} answered {got} for {size} queries; expected a list of "
                                     f"{size}")
        if not all(isinstance(r, int | float) and not isinstance(r, bool) for r in rewards):
            raise RewardServiceError(f"reward service {url} answered non-numeric rewards: {rewards[:5]!r}")
        answer["rewards"] = [float(r) for r in rewards]
        return answer


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) chunks of n items over at most `parts` URLs, sizes differing by at most one."""
    parts = min(parts, n)
    base, extra = divmod(n, parts)
    chunks, lo = [], 0
    for i in range(parts):
        hi = lo + base + (i < extra)
        chunks.append((lo, hi))
        lo = hi
    return chunks
