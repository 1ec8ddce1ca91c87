"""Flask app of the retrieval service (Search-R1's ``retrieval_server`` contract).

POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
            ->  {"result": [[{"document": {"id": "...", "contents": "..."}, "score": 12.3}, ...], ...]}
                (one list per query, best first; with return_scores false each item is the document)
GET  /health_check -> {"status": "ok", "n_docs": N, "kind": "bm25", ...}   (no authentication)

Errors answer ``{"error": "..."}``: 401 without a bearer token, 403 with a wrong one, 400 for
a body that is not the contract (the message names the field and what was expected), 413
past --max-body-bytes, 404/405 for other paths and methods (the token check and the error answers:
``trainer.services.app``).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from flask import Flask, Response, jsonify

from trainer.retrieval.index import Index
from trainer.services.app import RequestError, create_service_app, json_error, read_body

__all__ = ["RetrievalLimits", "create_app", "parse_request"]

log = logging.getLogger("trainer.retrieval")
EXTENSION = "rlrun_retrieval"
_ROUTES = "POST /retrieve, GET /health_check"
_KEYS = ("queries", "topk", "return_scores")


@dataclass(frozen=True)
class RetrievalLimits:
    """What one /retrieve request may hold (the service's --max-queries, --max-topk, --max-chars,
    --max-body-bytes) and the topk it gets without one. How long a client may take to send it is the gunicorn
    worker's (trainer.services.worker.ConnectionLimits)."""

    max_queries: int = 512
    max_topk: int = 50
    max_chars: int = 10_000
    max_body_bytes: int = 4 * 1024 * 1024
    default_topk: int = 3


def parse_request(body: bytes, limits: RetrievalLimits) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a /retrieve body; RequestError naming what is wrong."""
    try:
        data = json.loads(body)
    except UnicodeDecodeError:
        raise RequestError(400, "the body is not UTF-8; expected a JSON object") from None
    except RecursionError:
        raise RequestError(400, "the body nests too deeply; expected "
                           '{"queries": ["..."], "topk": 3, "return_scores": false}') from None  # fmt: skip
    except ValueError as exc:
        raise RequestError(400, f"the body is not JSON ({exc}); expected "
                           '{"queries": ["..."], "topk": 3, "return_scores": false}') from None  # fmt: skip
    if not isinstance(data, dict):
        raise RequestError(400, f"the body is a JSON {type(data).__name__}; expected an object "
                           '{"queries": ["..."], "topk": 3, "return_scores": false}')  # fmt: skip
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise RequestError(400, f"unknown field(s) {', '.join(map(repr, unknown))}; expected only {', '.join(_KEYS)}")
    queries = data.get("queries")
    if not isinstance(queries, list):
        got = "missing" if "queries" not in data else f"a {type(queries).__name__}"
        raise RequestError(400, f"'queries' is {got}; expected a list of 1 to {limits.max_queries} strings")
    if not 1 <= len(queries) <= limits.max_queries:
        raise RequestError(400, f"'queries' has {len(queries)} items; expected 1 to {limits.max_queries} "
                           "(--max-queries): split the batch")  # fmt: skip
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise RequestError(400, f"queries[{i}] is a {type(q).__name__}; expected a string")
        if not q.strip():
            raise RequestError(400, f"queries[{i}] is empty; expected a non-empty string")
        if len(q) > limits.max_chars:
            raise RequestError(400, f"queries[{i}] has {len(q)} characters; expected at most {limits.max_chars}")
    topk = data.get("topk", limits.default_topk)
    if topk is None:
        topk = limits.default_topk
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise RequestError(400, f"'topk' is {json.dumps(topk)[:40]}; expected an integer 1 to {limits.max_topk}")
    if not 1 <= topk <= limits.max_topk:
        raise RequestError(400, f"'topk' is {topk}; expected 1 to {limits.max_topk} (--max-topk)")
    return_scores = data.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(400, f"'return_scores' is {json.dumps(return_scores)[:40]}; expected true or false")
    return queries, topk, return_scores



def render_result(index: Index, hits: list[list[tuple[int, float]]], return_scores: bool) -> bytes:
    """The response body, the stored passage JSON spliced in (no decode / re-encode per passage)."""
    parts = [b'{"result": [']
    for qi, row in enumerate(hits):
        if qi:
            parts.append(b", ")
        items = []
        for doc, score in row:
            if return_scores:
                items.append(b'{"document": ' + index.document_json(doc) + b', "score": '
                             + repr(round(score, 6)).encode() + b"}")  # fmt: skip
            else:
                items.append(index.document_json(doc))
        parts.append(b"[" + b", ".join(items) + b"]")
    parts.append(b"]}")
    return b"".join(parts)


def create_app(index: Index, token: str | None, limits: RetrievalLimits) -> Flask:
    """The retrieval app over a loaded ``index``; ``token`` None serves without authentication."""
    app = create_service_app("trainer.retrieval", token=token, realm="rlrun-retriever", routes=_ROUTES,
                             max_body_bytes=limits.max_body_bytes, log=log)
    app.extensions[EXTENSION] = index

    @app.get("/health_check")
    def health_check() -> Response:
        return jsonify({"status": "ok", "n_docs": index.n_docs, "kind": index.kind, "auth": bool(token),
                        "max_queries": limits.max_queries, "max_topk": limits.max_topk, "max_chars": limits.max_chars,
                        "pid": os.getpid()})  # fmt: skip

    @app.post("/retrieve")
    def retrieve() -> Response:
        try:
            queries, topk, return_scores = parse_request(read_body(limits.max_body_bytes), limits)
        except RequestError as exc:
            return json_error(exc.status, exc.message)
        hits = index.search(queries, topk)
        return Response(render_result(index, hits, return_scores), mimetype="application/json")

    return app
