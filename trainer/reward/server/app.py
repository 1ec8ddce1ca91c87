"""Flask app of the remote reward service (OpenRLHF ``--remote_rm_url`` contract).

POST /get_reward  {"query": [prompt+response, ...], "prompts": [...], "labels": [...]}
              ->  {"rewards": [float], "scores": [float], "extra_logs": {...}}
GET  /health_check -> {"status": "ok", ...}   (no authentication)

Everything else, errors included, answers JSON. Create one app per process
(gunicorn worker): it owns a VerifyPool of worker processes.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from trainer import services
from trainer.reward.extract import FALLBACK_STRATEGIES
from trainer.reward.math import MathRewardConfig, Reason, RewardResult, label_to_str
from trainer.reward.pool import VerifyPool
from trainer.reward.server.config import ServerConfig
from trainer.reward.server.dataset import DatasetIndex, load_dataset
from trainer.reward.server.ratelog import AUTH_LOG_PER_MINUTE, RateLimitedLog
from trainer.reward.server.validation import Limits, RequestError, RewardRequest, parse_reward_request

__all__ = ["create_app"]

log = logging.getLogger("trainer.reward.server")

EXTENSION = "rlrun_reward"
EXTRACTED_LOG_CHARS = 200
_ROUTES = "POST /get_reward, GET /health_check"
_COUNTED_REASONS = (
    Reason.NO_ANSWER,
    Reason.NO_LABEL,
    Reason.BAD_LABEL,
    Reason.PARSE_ERROR,
    Reason.TOO_LONG,
    Reason.TOO_COMPLEX,
    Reason.TIMEOUT,
    Reason.ERROR,
)


class _State:
    """Per-app objects, in app.extensions[EXTENSION]."""

    def __init__(
        self, config: ServerConfig, token: str | None, dataset: DatasetIndex | None, pool: VerifyPool
    ):
        self.config = config
        self.token = token.encode("utf-8") if token else None
        self.dataset = dataset
        self.pool = pool
        self.limits = Limits(max_items=config.max_items, max_chars=config.max_chars)
        self.auth_log = RateLimitedLog(log.warning, per_minute=AUTH_LOG_PER_MINUTE)


_error = services.json_error


def _check_auth(state: _State) -> Response | None:
    """401 without a bearer token, 403 with a wrong one, None when allowed.

    Every refusal is logged with the peer's address (at most AUTH_LOG_PER_MINUTE lines a
    minute, then a count); the header's value never is.
    """
    challenge = {"WWW-Authenticate": 'Bearer realm="rlrun-reward"'}
    assert state.token is not None
    refusal = services.bearer_refusal(request.headers.get("Authorization"), state.token)
    if refusal is None:
        return None
    status, why, message = refusal
    state.auth_log(
        "refused %s %s from %s: HTTP %d (%s)", request.method, request.path[:100], request.remote_addr, status, why
    )
    return _error(status, message, challenge if status == 401 else None)


def _read_body(limit: int) -> bytes:
    """The request body; 413 past ``limit`` bytes, also for chunked bodies without Content-Length.

    (Werkzeug stops a chunked body at the limit without complaint; one more read tells.)
    """
    data = request.get_data(cache=False)
    if len(data) >= limit and request.stream.read(1):
        raise RequestEntityTooLarge()
    return data


def _split_response(query: str, prompt: str | None) -> tuple[str, bool]:
    """(response, prompt_found): query minus its prompt (found anywhere, for left padding)."""
    if prompt is None or not prompt:
        return query, True
    if query.startswith(prompt):
        return query[len(prompt) :], True
    pos = query.find(prompt)
    if pos >= 0:
        return query[pos + len(prompt) :], True
    return query, False


def _labels_for(req: RewardRequest, dataset: DatasetIndex | None) -> tuple[list[str | None], int]:
    """Reference answer per item (request label, else dataset by prompt), and how many came from the dataset."""
    labels: list[str | None] = []
    from_dataset = 0
    for i in range(len(req.queries)):
        given = req.labels[i] if req.labels is not None else None
        if given is not None and given != "":
            labels.append(label_to_str(given))
            continue
        found = dataset.lookup(req.prompts[i]) if dataset is not None and req.prompts is not None else None
        from_dataset += found is not None
        labels.append(found)
    return labels, from_dataset


def _reward_body(
    results: list[RewardResult], started: float, prompt_misses: int, from_dataset: int
) -> dict[str, Any]:
    scores = [r.score for r in results]
    reasons = [r.reason for r in results]
    n = len(results)
    extra_logs: dict[str, Any] = {
        # "correct:boxed", "wrong:final_expression", "no_answer", ...: the verdict and the
        # extraction path that found the answer (FALLBACK_STRATEGIES for unmarked responses)
        "reason": [r.detail for r in results],
        "extracted": [None if r.extracted is None else r.extracted[:EXTRACTED_LOG_CHARS] for r in results],
        "accuracy": sum(scores) / n,
        "n_items": n,
        "latency_s": round(time.perf_counter() - started, 6),
        "labels_from_dataset": from_dataset,
        "prompt_not_in_query": prompt_misses,
    }
    for reason in _COUNTED_REASONS:
        extra_logs[f"n_{reason}"] = reasons.count(reason)
    extra_logs["n_unmarked"] = sum(r.path in FALLBACK_STRATEGIES for r in results)
    return {"rewards": scores, "scores": list(scores), "extra_logs": extra_logs}


def create_app(
    config: ServerConfig, *, dataset: DatasetIndex | None = None, pool: VerifyPool | None = None
) -> Flask:
    """Build the reward app.

    Raises ConfigError (auth on without a usable token) or DatasetError. ``dataset``
    and ``pool`` may be passed pre-built (the CLI loads the dataset once, before forking).
    """
    token = config.resolve_token()
    if not config.auth:
        log.warning("authentication is DISABLED (--no-auth): anyone who can reach this port can use it")
    if dataset is None and config.dataset:
        dataset = load_dataset(config.dataset, config.input_key, config.label_key, config.prompt_template)
    if pool is None:
        math_config = MathRewardConfig(
            strategies=config.strategies,
            lenient=config.lenient,
            max_answer_chars=config.max_answer_chars,
            max_digits=config.max_digits,
        )
        pool = VerifyPool(
            config.verify_processes,
            timeout=config.timeout,
            wall_timeout=config.wall_timeout,
            config=math_config,
            max_processes=config.max_verify_processes,
            memory_limit_mb=config.memory_limit_mb,
            cache_size=config.cache_size,
        )
    state = _State(config, token, dataset, pool)

    app = Flask("trainer.reward.server")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[EXTENSION] = state

    @app.before_request
    def authenticate() -> Response | None:
        if state.token is None or request.endpoint == "health_check":
            return None
        return _check_auth(state)

    @app.get("/health_check")
    def health_check() -> Response:
        """Liveness and pool state. Needs no authentication (it reveals no secrets, takes no input)."""
        return jsonify(
            {
                "status": "ok",
                "pid": os.getpid(),
                "auth": state.token is not None,
                "dataset_items": len(state.dataset) if state.dataset is not None else 0,
                "pool": state.pool.info(),
            }
        )

    @app.post("/get_reward")
    def get_reward() -> Response:
        """Score a batch: extract each response's final answer and verify it against its label."""
        started = time.perf_counter()
        try:
            req = parse_reward_request(
                _read_body(config.max_body_bytes),
                request.headers.get("Content-Type"),
                state.limits,
                have_dataset=state.dataset is not None,
            )
        except RequestError as exc:
            return _error(exc.status, exc.message)
        prompts = req.prompts or [None] * len(req.queries)
        split = [_split_response(q, p) for q, p in zip(req.queries, prompts, strict=True)]
        labels, from_dataset = _labels_for(req, state.dataset)
        results = state.pool.score([response for response, _ in split], labels)
        body = _reward_body(results, started, sum(not found for _, found in split), from_dataset)
        log.info(
            "get_reward items=%d accuracy=%.3f timeouts=%d latency=%.3fs",
            len(results),
            body["extra_logs"]["accuracy"],
            body["extra_logs"]["n_timeout"],
            body["extra_logs"]["latency_s"],
        )
        return jsonify(body)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        if code == 404:
            message = f"no such endpoint {request.path!r}; expected one of: {_ROUTES}"
        elif code == 405:
            message = (
                f"method {request.method} is not allowed on {request.path!r}; expected one of: {_ROUTES}"
            )
        elif code == 413:
            message = f"request body is larger than {config.max_body_bytes} bytes (--max-body-bytes)"
        else:
            message = f"{exc.name}: {exc.description}"
        response = _error(code, message)
        if code == 405 and exc.get_response().headers.get("Allow"):
            response.headers["Allow"] = exc.get_response().headers["Allow"]
        return response

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(500, "internal error")

    return app
