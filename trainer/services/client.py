"""The HTTP client base of the services' clients (the reward client, the retrieval client).

What every request to a service does, written once: a bearer token in ``Authorization``; https checked
against a CA file (else the system's CAs); connection errors, timeouts and 5xx answers retried with
exponential backoff (``backoff * 2**k`` seconds before retry k+1, at most ``MAX_BACKOFF``): ``retries``
times, and beyond that for as long as the service has been failing less than ``outage_timeout`` seconds (an
outage is waited out, and said so once when it starts and once when it ends); a 4xx answer (bad token, bad
request) and a TLS failure raised at once, since retrying cannot fix them; every failure one line naming the
service, the URL and the cause. Nothing here turns a failure into an answer. One ``requests.Session`` per
thread (the clients send chunks from a thread pool).
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import requests

from trainer.deadlines import Fault

__all__ = ["MAX_BACKOFF", "ServiceClient", "ServiceError", "error_text", "health_url", "request_failure"]

#: Seconds between two tries of a failing request, at most (the backoff doubles up to it).
MAX_BACKOFF = 30.0


class ServiceError(Fault):
    """A request to a service failed for good: the message names the URL and the cause (the one line a
    training job ends with, :class:`trainer.deadlines.Fault`). ``status``: the HTTP status of a refusal (4xx);
    ``exhausted``: the retries (and the outage deadline) ran out on what a retry could have fixed."""

    def __init__(self, message: str, status: int | None = None, exhausted: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.exhausted = exhausted


def error_text(resp: requests.Response) -> str:
    """A service's 4xx/5xx answer as text: its JSON ``error`` field, else the body (300 characters at most)."""
    try:
        return str(resp.json().get("error", resp.text))[:300]
    except (ValueError, AttributeError):
        return resp.text[:300]


def request_failure(exc: requests.RequestException) -> str:
    """Why a request got no answer, in a few words."""
    if isinstance(exc, requests.Timeout):
        return "timed out"
    if isinstance(exc, requests.ConnectionError):
        return "connection refused or unreachable"
    return type(exc).__name__


def health_url(url: str) -> str:
    """The service's ``/health_check`` next to an endpoint URL (``.../get_reward``, ``.../retrieve``)."""
    return url.rsplit("/", 1)[0] + "/health_check"


class ServiceClient:
    """Requests to one kind of service; a subclass names it and says what its refusals mean.

    Class attributes: ``what`` (``"reward service"``), ``error`` (the exception it raises), ``hints``
    (what to do about a 4xx status, appended to the message), ``ca_env`` (the variable that names the CA
    file, for the TLS message), ``outage_flag`` (the trainer flag of ``outage_timeout``, for messages).
    """

    what: ClassVar[str] = "service"
    error: ClassVar[type[Exception]] = ServiceError
    hints: ClassVar[dict[int, str]] = {}
    ca_env: ClassVar[str | None] = None
    outage_flag: ClassVar[str] = "outage_timeout"

    def __init__(self, *, token: str | None, timeout: float, retries: int, backoff: float,
                 ca_file: str | None = None, outage_timeout: float = 0.0) -> None:
        if not timeout > 0 or retries < 0 or backoff < 0 or outage_timeout < 0:
            raise ValueError(f"timeout must be > 0 and retries, backoff, outage_timeout >= 0; got {timeout}, "
                             f"{retries}, {backoff}, {outage_timeout}")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.outage_timeout = outage_timeout
        # Passed with every request: requests lets $REQUESTS_CA_BUNDLE override a session's verify.
        self.verify: str | bool = ca_file or True
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()

    @property
    def session(self) -> requests.Session:
        """This thread's session (kept-alive connections, not shared across threads)."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def why(self, exc: requests.RequestException) -> str:
        """Why a request got no answer; a TLS failure says which CA the certificate must come from."""
        if isinstance(exc, requests.exceptions.SSLError):
            where = f"the CA in ${self.ca_env}" if self.ca_env else "a CA this machine trusts"
            return f"TLS failed ({str(exc)[-160:]}); an https {self.what} must present a certificate from {where}"
        return request_failure(exc)

    def get_health(self, url: str) -> requests.Response:
        """The 200 answer of ``url``'s /health_check; the error when it is unreachable or answers otherwise."""
        health = health_url(url)
        try:
            resp = self.session.get(health, timeout=min(self.timeout, 10.0), verify=self.verify)
        except requests.RequestException as exc:
            raise self.error(f"{self.what} {health} is unreachable: {self.why(exc)}") from None
        if resp.status_code != 200:
            raise self.error(f"{self.what} {health} answered HTTP {resp.status_code}: {error_text(resp)}")
        return resp

    def post(self, url: str, body: dict[str, Any]) -> requests.Response:
        """POST ``body`` as JSON to ``url`` until it answers 200, retrying what a retry can fix: ``retries``
        times, and for as long as the service has failed less than ``outage_timeout`` seconds."""
        last = ""
        attempts = 0
        down_since: float | None = None  # when the first failed try of this request ended
        while True:
            try:
                resp = self.session.post(url, json=body, headers=self.headers, timeout=self.timeout,
                                         verify=self.verify)
            except requests.exceptions.SSLError as exc:  # retrying cannot fix a certificate
                raise self.error(f"{self.what} {url}: {self.why(exc)}") from None
            except requests.RequestException as exc:
                last = self.why(exc)
            else:
                if resp.status_code < 500:
                    if resp.status_code != 200:
                        raise self.error(f"{self.what} {url} refused the request: HTTP {resp.status_code}: "
                                         f"{error_text(resp)}{self.hints.get(resp.status_code, '')}",
                                         status=resp.status_code)
                    if down_since is not None and attempts > self.retries:  # an outage was announced
                        print(f"{self.what} {url} answers again after {time.monotonic() - down_since:.0f} s",
                              flush=True)
                    return resp
                last = f"HTTP {resp.status_code}: {error_text(resp)}"
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            attempts += 1
            waited = now - down_since
            if attempts > self.retries and waited >= self.outage_timeout:
                span = (f" over {waited:.0f} s (--{self.outage_flag} {self.outage_timeout:g})"
                        if self.outage_timeout > 0 else "")
                raise self.error(f"{self.what} {url} failed after {attempts} attempts{span}: {last}", exhausted=True)
            if attempts == self.retries + 1:  # the retries are spent: from here on it is an outage
                print(f"{self.what} {url} is not answering ({last}); waiting for it up to "
                      f"{self.outage_timeout:g} s (--{self.outage_flag})", flush=True)
            delay = min(self.backoff * 2 ** (attempts - 1), MAX_BACKOFF)
            if attempts > self.retries:  # no sleep past the outage deadline: one last try right at it
                delay = min(delay, max(0.0, down_since + self.outage_timeout - now))
            time.sleep(delay)

    def answer(self, url: str, resp: requests.Response) -> Any:
        """``resp``'s JSON body; the error naming ``url`` when it is not JSON."""
        try:
            return resp.json()
        except ValueError:
            raise self.error(f"{self.what} {url} answered something that is not JSON: {resp.text[:200]!r}") from None
