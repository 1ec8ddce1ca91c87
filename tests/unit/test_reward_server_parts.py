"""Pieces of the reward server that need no server: request framing, limits, the rate-limited log."""

from __future__ import annotations

import pytest

from trainer.services.ratelog import RateLimitedLog
from trainer.services.worker import BadRequest, ConnectionLimits, _Conn, _frame, _scan_chunks


class _FakeSock:
    pass


def _conn(body: bytes, head: bytes = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") -> _Conn:
    conn = _Conn(_FakeSock(), ("127.0.0.1", 1), ("127.0.0.1", 2), None)  # type: ignore[arg-type]
    conn.buf = bytearray(head + body)
    conn.head_end = conn.chunk_pos = len(head)
    return conn


@pytest.mark.parametrize(
    ("head", "framing"),
    [
        (b"POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n", (12, False, False)),
        (b"POST / HTTP/1.1\r\ncontent-length:  7 \r\nExpect: 100-continue\r\n\r\n", (7, False, True)),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", (None, True, False)),
        (b"GET /health_check HTTP/1.1\r\nHost: x\r\n\r\n", (None, False, False)),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", (5, False, False)),
    ],
)
def test_frame(head: bytes, framing: tuple) -> None:
    assert _frame(head) == framing


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    ],
)
def test_frame_refuses_ambiguous_bodies(head: bytes) -> None:
    with pytest.raises(BadRequest):
        _frame(head)


def test_chunked_body_is_framed_incrementally() -> None:
    body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nNEXT"
    for cut in range(len(body) - 4):
        conn = _conn(body[:cut])
        assert _scan_chunks(conn) is None, cut  # not complete yet
    conn = _conn(body)
    end = _scan_chunks(conn)
    assert end is not None and bytes(conn.buf[end:]) == b"NEXT"
    assert conn.chunk_size == 11


def test_chunked_trailers_and_bad_sizes() -> None:
    conn = _conn(b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n")
    assert _scan_chunks(conn) == len(conn.buf)
    with pytest.raises(BadRequest, match="invalid chunk size"):
        _scan_chunks(_conn(b"zz\r\nabc\r\n"))
    with pytest.raises(BadRequest, match="too long"):
        _scan_chunks(_conn(b"1" * 2000))


def test_chunked_size_counts_toward_the_limit_while_arriving() -> None:
    conn = _conn(b"100000\r\n" + b"x" * 5000)  # a 1 MiB chunk, 5 kB of it here
    assert _scan_chunks(conn) is None
    assert conn.chunk_size >= 5000


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="head_timeout must be > 0"):
        ConnectionLimits(head_timeout=0)
    with pytest.raises(ValueError, match="max_body_bytes must be >= 1"):
        ConnectionLimits(max_body_bytes=0)


def test_rate_limited_log_counts_what_it_leaves_out() -> None:
    lines: list[str] = []
    now = [0.0]
    log = RateLimitedLog(lambda msg, *args: lines.append(msg % args), per_minute=3, clock=lambda: now[0])
    results = [log("refused %s", i) for i in range(10)]
    assert results == [True] * 3 + [False] * 7
    assert lines == ["refused 0", "refused 1", "refused 2"]
    now[0] = 61.0
    assert log("refused %s", 10)
    assert lines[-2:] == ["7 more like the following were not logged in the last minute", "refused 10"]
    with pytest.raises(ValueError):
        RateLimitedLog(print, per_minute=0)
