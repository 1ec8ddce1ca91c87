"""Schema validation of POST /get_reward bodies.

Every failure raises RequestError with an HTTP status and a message naming the
field, what was given and what was expected; nothing here echoes request content
beyond type names and sizes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from trainer.services.app import RequestError

__all__ = ["RewardLimits", "RewardRequest", "json_type", "parse_reward_request"]

ALLOWED_KEYS = ("query", "prompts", "labels")
_JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class RewardLimits:
    """What one /get_reward request may hold (ServerConfig's max_items, max_chars). How long a client may take to
    send it is the gunicorn worker's (trainer.services.worker.ConnectionLimits)."""

    max_items: int
    max_chars: int


@dataclass(frozen=True)
class RewardRequest:
    """A validated request. Labels are str, int, float or None (None / "" = look up by prompt)."""

    queries: list[str]
    prompts: list[str] | None
    labels: list[Any] | None


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (only finite numbers are)")


def _decode(raw: bytes) -> Any:
    if not raw.strip():
        raise RequestError(400, "request body is empty; expected a JSON object with a 'query' list")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(
            400, f"request body is not valid UTF-8 (byte {exc.start}); expected UTF-8 JSON"
        ) from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise RequestError(
            400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "request body is not valid JSON: nested too deeply") from None


def _check_list(body: dict[str, Any], key: str, n: int | None) -> list[Any]:
    value = body[key]
    if not isinstance(value, list):
        raise RequestError(400, f"'{key}' must be an array; got {json_type(value)}")
    if n is not None and len(value) != n:
        raise RequestError(
            400, f"'{key}' has {len(value)} items but 'query' has {n}; expected one per query item"
        )
    return value


def _check_string(key: str, i: int, value: Any, limits: RewardLimits, what: str = "a string") -> None:
    if not isinstance(value, str):
        raise RequestError(400, f"'{key}[{i}]' must be {what}; got {json_type(value)}")
    if len(value) > limits.max_chars:
        raise RequestError(
            413,
            f"'{key}[{i}]' is {len(value)} characters long; the limit is {limits.max_chars} (--max-chars)",
        )


def parse_reward_request(
    raw: bytes, content_type: str | None, limits: RewardLimits, *, have_dataset: bool
) -> RewardRequest:
    """Decode and validate a /get_reward body, or raise RequestError."""
    if content_type:
        mime = content_type.split(";", 1)[0].strip().lower()
        if mime not in _JSON_TYPES and not mime.endswith("+json"):
            raise RequestError(415, f"Content-Type must be application/json; got {mime!r}")
    body = _decode(raw)
    if not isinstance(body, dict):
        raise RequestError(400, f"request body must be a JSON object; got {json_type(body)}")
    unknown = sorted(k for k in body if k not in ALLOWED_KEYS)
    if unknown:
        names = ", ".join(repr(k[:50]) for k in unknown[:5])
        raise RequestError(
            400, f"unknown top-level key(s) {names}; expected only {', '.join(map(repr, ALLOWED_KEYS))}"
        )
    if "query" not in body:
        raise RequestError(400, "'query' is required: a non-empty array of strings (prompt + response)")
    queries = _check_list(body, "query", None)
    if not queries:
        raise RequestError(400, "'query' is empty; expected at least one string (prompt + response)")
    if len(queries) > limits.max_items:
        raise RequestError(
            413,
            f"'query' has {len(queries)} items; the limit is {limits.max_items} per request (--max-items)",
        )
    for i, q in enumerate(queries):
        _check_string("query", i, q, limits)

    prompts = None
    if body.get("prompts") is not None:
        prompts = _check_list(body, "prompts", len(queries))
        for i, p in enumerate(prompts):
            _check_string("prompts", i, p, limits)

    labels = None
    if body.get("labels") is not None:
        labels = _check_list(body, "labels", len(queries))
        for i, label in enumerate(labels):
            if isinstance(label, str):
                _check_string("labels", i, label, limits)
            elif label is not None and (
                isinstance(label, bool) or not isinstance(label, int | float) or not math.isfinite(label)
            ):
                raise RequestError(
                    400, f"'labels[{i}]' must be a string, a number or null; got {json_type(label)}"
                )

    needs_lookup = labels is None or any(label is None or label == "" for label in labels)
    if needs_lookup and not have_dataset and labels is None:
        raise RequestError(
            400, "'labels' is required: this server has no --dataset to look reference answers up by prompt"
        )
    if needs_lookup and have_dataset and prompts is None:
        raise RequestError(
            400,
            "'prompts' is required when 'labels' is missing or has empty items: answers are looked up by prompt",
        )
    return RewardRequest(queries=queries, prompts=prompts, labels=labels)
