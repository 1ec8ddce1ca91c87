"""The Flask app factory of the services: what every request meets before and after the service's own routes.

:func:`create_service_app` makes the app; the service then adds its routes. Every answer is JSON:

* the bearer token is checked before any route but ``/health_check`` (401 without a bearer token, with a
  ``WWW-Authenticate`` challenge; 403 with a wrong one; compared in constant time); every refusal is logged
  with the peer's address, at most ``AUTH_LOG_PER_MINUTE`` lines a minute, never the header's value;
* 404 and 405 name the routes there are (405 keeps Werkzeug's ``Allow`` header), 413 names the limit and its
  flag, any other HTTP error its name and description;
* an exception in a route is logged with its traceback and answered ``{"error": "internal error"}`` (500),
  nothing of the traceback sent.
"""

from __future__ import annotations

import hmac
import logging

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from trainer.services.ratelog import RateLimitedLog

__all__ = ["AUTH_LOG_PER_MINUTE", "RequestError", "bearer_refusal", "create_service_app", "json_error", "read_body"]

# Failed authentications a service logs per minute (then a count of the rest).
AUTH_LOG_PER_MINUTE = 20
BEARER_EXPECTED = "expected 'Authorization: Bearer <token>'"
OPEN_ENDPOINTS = ("health_check",)  # answered without a token: they reveal no secrets and take no input


class RequestError(ValueError):
    """A request a service refuses: the HTTP ``status`` and the ``message`` for the client (it names the field, what
    was given and what was expected, and echoes no request content beyond type names and sizes). The services'
    request parsers raise it; their routes answer it with :func:`json_error`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """A response ``{"error": message}`` with ``status`` (and extra headers)."""
    response = jsonify({"error": message})
    response.status_code = status
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def bearer_refusal(header: str | None, token: bytes) -> tuple[int, str, str] | None:
    """Why a request's ``Authorization`` header does not carry ``token``, as (HTTP status, a few words for the
    log, the message for the client): 401 without a bearer token, 403 with a wrong one; None when it does.
    The comparison takes constant time."""
    if not header:
        return 401, "no token", f"missing Authorization header; {BEARER_EXPECTED}"
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return 401, "not a bearer token", f"malformed Authorization header; {BEARER_EXPECTED}"
    if not hmac.compare_digest(value.strip().encode("utf-8"), token):
        return 403, "wrong token", "invalid bearer token"
    return None


def read_body(limit: int) -> bytes:
    """The request body; 413 past ``limit`` bytes, also for chunked bodies without Content-Length.

    (Werkzeug stops a chunked body at the limit without complaint; one more read tells.)
    """
    data = request.get_data(cache=False)
    if len(data) >= limit and request.stream.read(1):
        raise RequestEntityTooLarge()
    return data


def create_service_app(name: str, *, token: str | None, realm: str, routes: str, max_body_bytes: int,
                       log: logging.Logger) -> Flask:
    """A Flask app that checks ``token`` (None: no authentication) and answers errors as JSON.

    ``realm`` names the service in the 401 challenge; ``routes`` lists its routes for the 404/405 messages
    (``"POST /get_reward, GET /health_check"``); bodies past ``max_body_bytes`` get 413.
    """
    expected = token.encode("utf-8") if token else None
    app = Flask(name)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.json.sort_keys = False  # type: ignore[attr-defined]
    auth_log = RateLimitedLog(log.warning, per_minute=AUTH_LOG_PER_MINUTE)
    challenge = {"WWW-Authenticate": f'Bearer realm="{realm}"'}

    @app.before_request
    def authenticate() -> Response | None:
        if expected is None or request.endpoint in OPEN_ENDPOINTS:
            return None
        refusal = bearer_refusal(request.headers.get("Authorization"), expected)
        if refusal is None:
            return None
        status, why, message = refusal
        auth_log("refused %s %s from %s: HTTP %d (%s)", request.method, request.path[:100], request.remote_addr,
                 status, why)
        return json_error(status, message, challenge if status == 401 else None)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        if code == 404:
            message = f"no such endpoint {request.path!r}; expected one of: {routes}"
        elif code == 405:
            message = f"method {request.method} is not allowed on {request.path!r}; expected one of: {routes}"
        elif code == 413:
            message = f"request body is larger than {max_body_bytes} bytes (--max-body-bytes)"
        else:
            message = f"{exc.name}: {exc.description}"
        allow = exc.get_response().headers.get("Allow") if code == 405 else None
        return json_error(code, message, {"Allow": allow} if allow else None)

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_error(500, "internal error")

    return app
