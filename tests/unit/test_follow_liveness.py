"""Following a job's log: a quiet stream is followed for as long as the head answers, and a head that stops
answering ends the follow with one line after about twice --timeout (a real HTTP and websocket server on
loopback plays the dashboard)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from aiohttp import web

from rlrun.errors import RlrunError
from rlrun.jobs import Jobs

STATUS = {"status": "RUNNING", "message": "", "job_id": "01000000", "submission_id": "j", "type": "SUBMISSION",
          "entrypoint": "python x.py"}


class Dashboard:
    """/api/version, /api/jobs/j (status) and /api/jobs/j/logs/tail: one line after `first_line_after` s,
    then silence; the status endpoint hangs once `hung` is set."""

    def __init__(self, first_line_after: float):
        self.hung = False
        self.first_line_after = first_line_after
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)

        async def tail(request):
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await asyncio.sleep(self.first_line_after)
            await ws.send_str("hello\n")
            await asyncio.sleep(3600)
            return ws

        async def status(request):
            if self.hung:
                await asyncio.sleep(3600)
            return web.json_response(STATUS)

        async def version(request):
            return web.json_response({"ray_version": "2.60.0", "version": "4", "ray_commit": "x"})

        app = web.Application()
        app.add_routes([web.get("/api/jobs/j/logs/tail", tail), web.get("/api/jobs/j", status),
                        web.get("/api/version", version)])
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()


@pytest.fixture(scope="module")
def dashboard():
    return Dashboard(first_line_after=2.5)


def jobs_for(dashboard, timeout):
    cluster = SimpleNamespace(dashboard_url=f"http://127.0.0.1:{dashboard.port}", token=None, auth_enabled=False,
                              token_store=None)
    return Jobs(cluster, timeout=timeout)


def test_a_quiet_job_is_followed_past_the_timeout(dashboard):
    dashboard.hung = False
    jobs, lines = jobs_for(dashboard, timeout=1.0), []
    with pytest.raises(asyncio.TimeoutError):  # still following when the test stops it
        asyncio.run(asyncio.wait_for(jobs._tail("j", lines.append), 4.0))
    assert lines == ["hello\n"]  # the line came 2.5 s in: more than the 1 s timeout of quiet


def test_a_head_that_stops_answering_ends_the_follow_with_one_line(dashboard):
    jobs = jobs_for(dashboard, timeout=1.0)
    dashboard.hung = True
    start = time.monotonic()
    try:
        with pytest.raises(RlrunError, match=r"did not answer within 1 s"), jobs._errors("j"):
            asyncio.run(jobs._tail("j", lambda _line: None))
    finally:
        dashboard.hung = False
    assert time.monotonic() - start < 30  # about 2 x the timeout; never a hang
