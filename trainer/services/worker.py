"""A gunicorn worker that reads whole requests before a thread sees them.

gunicorn's gthread worker hands a connection to a thread as soon as some bytes arrive,
and the thread then blocks in ``recv()`` until the request is complete: a client that
sends half a request and stops holds a thread for as long as it likes (issue 15: eight
such clients stalled a 1 worker x 8 threads service, without a token). This worker keeps
gthread's thread pool for running the app but reads request heads and bodies itself, in
its event loop, without blocking, against deadlines (:class:`ConnectionLimits`):

* ``head_timeout``: the request line and headers must be complete this many seconds
  after the connection opened (or, on a kept-alive connection, after the first byte);
  late ones get ``408`` and are closed;
* ``body_timeout``: the body must be complete this many seconds after the headers;
* ``keepalive``: an idle kept-alive connection is closed after this many seconds;
* ``max_body_bytes``: a larger declared body (or a chunked one once it grows past the
  limit) is answered ``413`` at once; the rest of the body is then read and discarded
  (within ``body_timeout``) before the connection closes, so the client reads the
  413 rather than a broken pipe. With ``Expect: 100-continue`` the client is told
  before it sends anything.

Only complete requests reach the thread pool, so an idle or slow connection costs a
file descriptor and a buffer, never a thread; ``worker_connections`` bounds how many
are held. TLS (gunicorn's ``certfile`` / ``keyfile``) is handshaken in the event loop
too, under the head deadline.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import ssl
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn import sock as gsock
from gunicorn.workers.gthread import ThreadWorker

from trainer.services.ratelog import RateLimitedLog

__all__ = ["ConnectionLimits", "ReadFirstWorker"]

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD_BYTES = 64 * 1024
_RECV = 256 * 1024
_WRITE_TIMEOUT = 30.0
_ACCEPT_BURST = 128


@dataclass(frozen=True)
class ConnectionLimits:
    """How long and how much a client may take to send one request, for every service (what the request may hold
    is each service's own: RewardLimits, RetrievalLimits)."""

    head_timeout: float = 10.0
    body_timeout: float = 60.0
    keepalive: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("head_timeout", "body_timeout", "keepalive"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")


class BadRequest(Exception):
    """The head cannot be framed (bad Content-Length, chunk size, ...)."""


def _response(status: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    ).encode() + body


class _Conn:
    """One client connection and what has been read of its current request."""

    __slots__ = (
        "sock", "client", "server", "cfg", "buf", "state", "idle", "deadline", "head_end", "length", "chunked",
        "chunk_pos", "chunk_size", "handshaken", "drain_left", "parser",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, client: Any, server: Any, cfg: Any) -> None:
        self.sock = sock
        self.client = client
        self.server = server
        self.cfg = cfg
        self.buf = bytearray()
        self.state = "head"  # head | body | drain | busy
        self.idle = False  # kept alive, waiting for the next request's first byte
        self.deadline = 0.0
        self.head_end = -1
        self.length: int | None = None
        self.chunked = False
        self.chunk_pos = 0
        self.chunk_size = 0
        self.handshaken = not isinstance(sock, ssl.SSLSocket)
        self.drain_left: int | None = None
        self.parser: Any = None  # gunicorn's, set per request in the thread

    def next_request(self, deadline: float, idle: bool = False) -> None:
        self.state, self.deadline, self.idle = "head", deadline, idle
        self.head_end, self.length, self.chunked = -1, None, False
        self.chunk_pos = self.chunk_size = 0

    def close(self, graceful: bool = False) -> None:
        with contextlib.suppress(OSError):
            if graceful:
                self.sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            self.sock.close()


def _frame(head: bytes) -> tuple[int | None, bool, bool]:
    """(Content-Length, chunked, expects 100-continue) of a request head."""
    length: int | None = None
    chunked = expect = False
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise BadRequest("invalid Content-Length header")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = chunked or value.lower().split(b",")[-1].strip() == b"chunked"
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
    if chunked and length is not None:
        raise BadRequest("both Content-Length and Transfer-Encoding: chunked")
    return length, chunked, expect


def _scan_chunks(conn: _Conn) -> int | None:
    """Advance over complete chunks of a chunked body; the request's end offset once the last is in."""
    buf = conn.buf
    pos = conn.chunk_pos
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            if len(buf) - pos > 1024:
                raise BadRequest("chunk size line too long")
            conn.chunk_pos = pos
            return None
        size_text = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BadRequest("invalid chunk size") from None
        if size == 0:
            if buf[eol + 2 : eol + 4] == b"\r\n":
                return eol + 4
            trailer_end = buf.find(_HEAD_END, eol)
            if trailer_end < 0:
                conn.chunk_pos = pos
                return None
            return trailer_end + 4
        if len(buf) < eol + 2 + size + 2:
            conn.chunk_pos = pos
            conn.chunk_size = max(conn.chunk_size, len(buf) - conn.head_end)  # for the size limit
            return None
        pos = eol + 2 + size + 2
        conn.chunk_pos = pos
        conn.chunk_size += size


class ReadFirstWorker(ThreadWorker):
    """gthread with the request read in the event loop (see the module docstring)."""

    limits = ConnectionLimits()

    def init_process(self) -> None:
        configured = getattr(self.app, "worker_limits", None)
        if isinstance(configured, ConnectionLimits):
            self.limits = configured
        self._conns: set[_Conn] = set()
        self._ssl_context = gsock.ssl_context(self.cfg) if self.cfg.is_ssl else None
        self._slow_log = RateLimitedLog(self.log.warning, per_minute=10)
        super().init_process()

    # ------------------------------------------------------------ event loop side

    def accept(self, listener: socket.socket) -> None:
        """Take every connection waiting on the listener (a burst must not overflow its queue)."""
        for _ in range(_ACCEPT_BURST):
            if self.nr_conns >= self.worker_connections:
                return
            try:
                client_sock, client_addr = listener.accept()
            except OSError:
                return  # EAGAIN / ECONNABORTED: none left, another worker took it, or the client left
            self._accepted(listener, client_sock, client_addr)

    def _accepted(self, listener: socket.socket, client_sock: socket.socket, client_addr: Any) -> None:
        self.nr_conns += 1
        client_sock.setblocking(False)
        sock: socket.socket = client_sock
        if self._ssl_context is not None:
            sock = self._ssl_context.wrap_socket(
                client_sock, server_side=True, do_handshake_on_connect=False, suppress_ragged_eofs=True
            )
        conn = _Conn(sock, client_addr, listener.getsockname(), self.cfg)
        conn.next_request(time.monotonic() + self.limits.head_timeout)
        self._watch(conn)

    def _watch(self, conn: _Conn) -> None:
        self._conns.add(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _unwatch(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    def _drop(self, conn: _Conn, graceful: bool = False) -> None:
        self._unwatch(conn)
        self.nr_conns -= 1
        conn.close(graceful)

    def _on_readable(self, conn: _Conn, _sock: Any) -> None:
        if not conn.handshaken:
            try:
                conn.sock.do_handshake()  # type: ignore[attr-defined]
                conn.handshaken = True
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (ssl.SSLError, OSError) as exc:
                self.log.debug("TLS handshake with %s failed: %s", conn.client, exc)
                self._drop(conn)
                return
        while True:
            try:
                data = conn.sock.recv(_RECV)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except (OSError, ssl.SSLError):
                self._drop(conn)
                return
            if not data:
                self._drop(conn)
                return
            if conn.state == "drain":
                if conn.drain_left is not None:
                    conn.drain_left -= len(data)
                    if conn.drain_left <= 0:
                        self._drop(conn, graceful=True)
                        return
                continue
            if conn.idle:  # the first byte of the next request on a kept-alive connection
                conn.idle, conn.deadline = False, time.monotonic() + self.limits.head_timeout
            conn.buf += data
            if not isinstance(conn.sock, ssl.SSLSocket) or not conn.sock.pending():
                break
        if conn.state in ("head", "body"):
            self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Frame the buffered bytes; hand a complete request to a thread."""
        limits = self.limits
        try:
            if conn.state == "head":
                end = conn.buf.find(_HEAD_END)
                if end < 0:
                    if len(conn.buf) > _MAX_HEAD_BYTES:
                        self._refuse(conn, "431 Request Header Fields Too Large",
                                     f"request head is larger than {_MAX_HEAD_BYTES} bytes")
                    return
                conn.head_end = end + len(_HEAD_END)
                conn.length, conn.chunked, expect = _frame(bytes(conn.buf[: conn.head_end]))
                if conn.length is not None and conn.length > limits.max_body_bytes:
                    self._too_large(conn, drain=None if expect else conn.length - (len(conn.buf) - conn.head_end))
                    return
                if expect and (conn.length or conn.chunked):
                    self._send(conn, b"HTTP/1.1 100 Continue\r\n\r\n")
                conn.state, conn.deadline = "body", time.monotonic() + limits.body_timeout
                conn.chunk_pos = conn.head_end
            if conn.chunked:
                end = _scan_chunks(conn)
                if conn.chunk_size > limits.max_body_bytes:
                    self._too_large(conn, drain=-1)
                    return
            else:
                end = conn.head_end + (conn.length or 0)
                if len(conn.buf) < end:
                    return
            if end is not None:
                self._dispatch(conn, end)
        except BadRequest as exc:
            self._refuse(conn, "400 Bad Request", str(exc))

    def _send(self, conn: _Conn, data: bytes) -> bool:
        """Best-effort non-blocking send of a short answer; False when it did not all go out."""
        try:
            return conn.sock.send(data) == len(data)
        except (OSError, ssl.SSLError):
            return False

    def _refuse(self, conn: _Conn, status: str, message: str) -> None:
        self._send(conn, _response(status, message))
        self._drop(conn, graceful=True)

    def _too_large(self, conn: _Conn, drain: int | None) -> None:
        """413 now; then read and discard the body (``drain`` bytes, -1: until the deadline)."""
        message = f"request body is larger than {self.limits.max_body_bytes} bytes (--max-body-bytes)"
        if not self._send(conn, _response("413 Request Entity Too Large", message)) or drain is None or drain <= 0:
            self._drop(conn, graceful=True)
            return
        conn.state, conn.buf = "drain", bytearray()
        conn.drain_left = None if drain < 0 else drain
        conn.deadline = time.monotonic() + self.limits.body_timeout

    def _dispatch(self, conn: _Conn, end: int) -> None:
        self._unwatch(conn)
        request, conn.buf = bytes(conn.buf[:end]), conn.buf[end:]
        conn.state = "busy"
        future = self.tpool.submit(self._serve, conn, request)
        future.add_done_callback(lambda fut: self.method_queue.defer(self._served, conn, fut))

    def _served(self, conn: _Conn, future: Any) -> None:
        keep = False
        with contextlib.suppress(Exception):
            keep = bool(future.result())
        if not keep or not self.alive:
            self.nr_conns -= 1
            conn.close(graceful=True)
            return
        try:
            conn.sock.setblocking(False)
        except OSError:
            self.nr_conns -= 1
            conn.close()
            return
        if conn.buf:
            conn.next_request(time.monotonic() + self.limits.head_timeout)
        else:
            conn.next_request(time.monotonic() + self.limits.keepalive, idle=True)
        self._watch(conn)
        if conn.buf:  # pipelined: the next request is already (partly) here
            self._advance(conn)

    def murder_pending(self) -> None:
        """Each loop turn (at least once a second): close connections past their deadline."""
        super().murder_pending()
        now = time.monotonic()
        for conn in list(self._conns):
            if conn.state == "busy":
                continue
            if not self.alive:
                self._drop(conn)
            elif now >= conn.deadline:
                if conn.state in ("head", "body") and not conn.idle:
                    self._slow_log("closed a slow connection from %s: %s not complete in time", conn.client,
                                   "request head" if conn.state == "head" else "request body")
                    self._refuse(conn, "408 Request Timeout", f"request {conn.state} not received in time")
                else:
                    self._drop(conn, graceful=conn.state == "drain")

    # ------------------------------------------------------------ thread side

    def _serve(self, conn: _Conn, request: bytes) -> bool:
        """Run the app on one complete request (in a pool thread); True to keep the connection."""
        req = None
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(_WRITE_TIMEOUT)
            conn.parser = http.get_parser(self.cfg, iter([request]), conn.client)
            req = next(conn.parser)
            if not req:
                return False
            return self.handle_request(req, conn)
        except StopIteration:
            return False
        except (OSError, ssl.SSLError) as exc:
            self.log.debug("connection to %s failed while answering: %s", conn.client, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - gunicorn answers 400/500 for parser and app errors
            with contextlib.suppress(Exception):
                self.handle_error(req, conn.sock, conn.client, exc)
            return False


def worker_class_path() -> str:
    """The dotted path gunicorn's ``worker_class`` setting takes for this worker."""
    return f"{__name__}.{ReadFirstWorker.__name__}"

