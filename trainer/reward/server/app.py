"""Flask app of the remote reward service (OpenRLHF ``--remote_rm_url`` contract).

POST /get_reward  {"query": [prompt+response, ...], "prompts": [...], "labels": [...]}
              ->  {"rewards": [float], "scores": [float], "extra_logs": {...}}
GET  /health_check -> {"status": "ok", ...}   (no authentication)

Everything else, errors included, answers JSON (the token check and the error answers:
``trainer.services.app``). Create one app per process (gunicorn worker): it owns a VerifyPool of
worker processes.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from flask import Flask, Response, jsonify, request

from trainer.reward.extract import FALLBACK_STRATEGIES
from trainer.reward.math import MathRewardConfig, Reason, RewardResult, label_to_str
from trainer.reward.pool import VerifyPool, VerifyPoolError
from trainer.reward.server.config import ServerConfig
from trainer.reward.server.dataset import DatasetIndex, load_dataset
from trainer.reward.server.validation import RewardLimits, RewardRequest, parse_reward_request
from trainer.services.app import RequestError, create_service_app, json_error, read_body

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

    def __init__(self, config: ServerConfig, dataset: DatasetIndex | None, pool: VerifyPool):
        self.config = config
        self.dataset = dataset
        self.pool = pool
        self.limits = RewardLimits(max_items=config.max_items, max_chars=config.max_chars)


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

    Raises ServiceConfigError (auth on without a usable token) or DatasetError. ``dataset``
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
    state = _State(config, dataset, pool)
    app = create_service_app("trainer.reward.server", token=token, realm="rlrun-reward", routes=_ROUTES,
                             max_body_bytes=config.max_body_bytes, log=log)
    app.extensions[EXTENSION] = state

    @app.get("/health_check")
    def health_check() -> Response:
        """Liveness and pool state. Needs no authentication (it reveals no secrets, takes no input). A pool
        that failed answers 503: the service cannot score, and its supervisor should restart it."""
        if state.pool.failure is not None:
            return json_error(503, f"verify pool failed: {state.pool.failure}; restart the service")
        return jsonify(
            {
                "status": "ok",
                "pid": os.getpid(),
                "auth": bool(token),
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
                read_body(config.max_body_bytes),
                request.headers.get("Content-Type"),
                state.limits,
                have_dataset=state.dataset is not None,
            )
        except RequestError as exc:
            return json_error(exc.status, exc.message)
        prompts = req.prompts or [None] * len(req.queries)
        split = [_split_response(q, p) for q, p in zip(req.queries, prompts, strict=True)]
        labels, from_dataset = _labels_for(req, state.dataset)
        try:
            results = state.pool.score([response for response, _ in split], labels)
        except VerifyPoolError as exc:  # no verdict: an error the client retries, never a 0
            log.error("get_reward items=%d not scored: %s", len(split), exc)
            return json_error(503, str(exc))
        body = _reward_body(results, started, sum(not found for _, found in split), from_dataset)
        log.info(
            "get_reward items=%d accuracy=%.3f timeouts=%d latency=%.3fs",
            len(results),
            body["extra_logs"]["accuracy"],
            body["extra_logs"]["n_timeout"],
            body["extra_logs"]["latency_s"],
        )
        return jsonify(body)

    return app
