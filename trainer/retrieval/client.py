"""Client of the retrieval service (``python -m trainer.retrieval serve``), used by tool rollouts.

    client = RetrievalClient("http://127.0.0.1:8000/retrieve")
    passages = client.retrieve(["who wrote hamlet", "capital of peru"], topk=3)  # list[list[str]]

A batch is split into chunks of at most the service's ``max_queries`` (read once from its
/health_check; 512 if that fails), sent concurrently. A blank query (a policy's empty
``<search></search>``) gets no passages without a request; a query longer than the service's
``max_chars`` is cut to it (the service would refuse the whole batch). Connection errors, timeouts and 5xx
answers are retried with exponential backoff (a restarting service is waited for, up to ``outage_timeout``
seconds: ``--retriever_outage_timeout``); 4xx
answers and TLS failures are not (retrying cannot fix a bad token, request or certificate) and raise
:class:`RetrievalError` with the service's message (the requests: ``trainer.services.client``). Token: the argument, else ``$RLRUN_RETRIEVER_TOKEN``, else the
file named by ``$RLRUN_RETRIEVER_TOKEN_FILE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainer.services import token as service_token
from trainer.services.client import ServiceClient, ServiceError, health_url

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "RetrievalClient", "RetrievalError", "token_from_env"]

TOKEN_ENV = "RLRUN_RETRIEVER_TOKEN"
TOKEN_FILE_ENV = "RLRUN_RETRIEVER_TOKEN_FILE"
DEFAULT_MAX_QUERIES = 512
MAX_PARALLEL = 4


class RetrievalError(ServiceError):
    """A retrieval request failed for good: the message names the URL and the cause."""


def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """$RLRUN_RETRIEVER_TOKEN, else the content of the file $RLRUN_RETRIEVER_TOKEN_FILE, else None."""
    return service_token.token_from_env("retriever", TOKEN_ENV, TOKEN_FILE_ENV, RetrievalError, environ)


class RetrievalClient(ServiceClient):
    """Batched, retrying client of one retrieval service's ``POST /retrieve``."""

    what = "retrieval service"
    error = RetrievalError
    hints = {401: f" (no token sent: set {TOKEN_ENV} or {TOKEN_FILE_ENV})", 403: " (the token is not the service's)"}
    outage_flag = "retriever_outage_timeout"

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0, retries: int = 3,
                 backoff: float = 0.5, ca_file: str | None = None, outage_timeout: float = 0.0):  # fmt: skip
        """``token``: default $RLRUN_RETRIEVER_TOKEN, else the file $RLRUN_RETRIEVER_TOKEN_FILE; ``ca_file``: the
        CA an https service's certificate must chain to (default: the system's CAs)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retriever URL {url!r} must start with http:// or https://")
        if "{" in url:
            raise ValueError(f"retriever URL {url!r} still holds a placeholder; substitute it first")
        super().__init__(token=token if token is not None else token_from_env(), timeout=timeout, retries=retries,
                         backoff=backoff, ca_file=ca_file, outage_timeout=outage_timeout)
        self.url = url
        self.health_url = health_url(url)
        self._limits: dict[str, int] | None = None

    def health(self) -> dict[str, Any]:
        """The service's /health_check answer (RetrievalError when it is unreachable or not ok)."""
        body = self.answer(self.health_url, self.get_health(self.url))
        return body if isinstance(body, dict) else {}

    def _limit(self, name: str, default: int) -> int:
        """A limit the service states on /health_check (read once it answers), else ``default``."""
        limits = self._limits
        if limits is None:
            try:
                health = self.health()
            except RetrievalError:  # not up yet: the defaults now, ask again on the next call
                return default
            limits = {k: v for k, v in health.items() if isinstance(v, int) and not isinstance(v, bool)}
            self._limits = limits
        value = limits.get(name)
        return value if value is not None and value > 0 else default

    @property
    def max_queries(self) -> int:
        """Queries per request: the service's limit (512 when /health_check does not say)."""
        return self._limit("max_queries", DEFAULT_MAX_QUERIES)

    def search(self, queries: Sequence[str], topk: int = 3) -> list[list[dict[str, Any]]]:
        """Per query, up to ``topk`` ``{"document": {"id", "contents"}, "score"}`` dicts, best first."""
        queries = list(queries)
        if not queries:
            return []
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk must be an integer >= 1, got {topk!r}")
        bad = next((i for i, q in enumerate(queries) if not isinstance(q, str)), None)
        if bad is not None:
            raise TypeError(f"queries[{bad}] is a {type(queries[bad]).__name__}; expected a string")
        results: list[list[dict[str, Any]]] = [[] for _ in queries]
        asked = [i for i, q in enumerate(queries) if q.strip()]
        if not asked:
            return results
        size, max_chars = self.max_queries, self._limit("max_chars", 0)
        sent = [queries[i][:max_chars] if max_chars else queries[i] for i in asked]
        chunks = [sent[lo : lo + size] for lo in range(0, len(sent), size)]
        if len(chunks) == 1:
            answers = [self._post(chunks[0], topk)]
        else:
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(chunks))) as pool:
                answers = list(pool.map(lambda chunk: self._post(chunk, topk), chunks))
        for i, row in zip(asked, (row for answer in answers for row in answer), strict=True):
            results[i] = row
        return results

    def retrieve(self, queries: Sequence[str], topk: int = 3) -> list[list[str]]:
        """Per query, the ``contents`` of up to ``topk`` passages, best first."""
        return [[hit["document"]["contents"] for hit in row] for row in self.search(queries, topk)]

    def _post(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        resp = self.post(self.url, {"queries": queries, "topk": topk, "return_scores": True})
        return _checked(self.url, self.answer(self.url, resp), len(queries))


def _checked(url: str, answer: Any, n: int) -> list[list[dict[str, Any]]]:
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, list) or len(result) != n:
        got = f"{len(result)} lists" if isinstance(result, list) else type(result).__name__
        raise RetrievalError(f"retrieval service {url} answered {got} for {n} queries; expected {n} lists")
    for row in result:
        if not isinstance(row, list) or not all(
            isinstance(hit, dict) and isinstance(hit.get("document"), dict)
            and isinstance(hit["document"].get("contents"), str) for hit in row
        ):  # fmt: skip
            raise RetrievalError(f"retrieval service {url} answered a malformed result row: {str(row)[:200]}")
    return result

