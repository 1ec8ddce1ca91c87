"""`python -m rlrun.nodecheck --wait`: the status play's one wait for every node, against a small HTTP server
that answers the dashboard's /api/v0/nodes as Ray 2.60 does (only the fields rlrun reads), one scripted
listing per request: nodes still joining, a restarted node's old self not yet dead, a dashboard that is not
up yet, a node that never comes."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlrun import nodecheck
from rlrun.dashboard import wait_nodes_alive
from rlrun.errors import RlrunError

TOKEN = "t" * 64


def _node(ip: str, state: str = "ALIVE", cpus: float = 1.0) -> dict:
    return {"node_id": f"id-{ip}-{state}", "node_ip": ip, "is_head_node": ip.endswith(".1"), "state": state,
            "resources_total": {"CPU": cpus}}


class Dashboard:
    """Answers request i with listings[min(i, last)]; an int answers that HTTP status instead."""

    def __init__(self, listings: list):
        self.listings, self.calls = listings, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(403)
                    self.end_headers()
                    return
                item = outer.listings[min(outer.calls, len(outer.listings) - 1)]
                outer.calls += 1
                if isinstance(item, int):
                    self.send_response(item)
                    self.end_headers()
                    return
                body = json.dumps({"data": {"result": {"result": item}}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dashboard():
    made = []

    def make(listings):
        made.append(Dashboard(listings))
        return made[-1]

    yield make
    for d in made:
        d.close()


HEAD, W1 = "10.0.0.1", "10.0.0.2"


def test_waits_while_nodes_join(dashboard):
    d = dashboard([[_node(HEAD)], [_node(HEAD)], [_node(HEAD), _node(W1)]])
    nodes = wait_nodes_alive(d.url, TOKEN, 2, timeout=10, interval=0.01)
    assert sorted(n.node_ip for n in nodes if n.alive) == [HEAD, W1] and d.calls == 3


def test_waits_until_a_restarted_nodes_old_self_is_dead(dashboard):
    """A restarted worker: its old node still ALIVE beside the new one (3 for 2), then DEAD; the CPUs counted
    are the new node's."""
    old, new = _node(W1, cpus=1.0), {**_node(W1, cpus=2.0), "node_id": "id-new"}
    d = dashboard([[_node(HEAD), old, new], [_node(HEAD), {**old, "state": "DEAD"}, new]])
    nodes = wait_nodes_alive(d.url, TOKEN, 2, timeout=10, interval=0.01)
    assert sum(n.cpus for n in nodes if n.alive) == 3.0 and d.calls == 2


def test_a_dashboard_that_is_not_up_yet_is_waited_for(dashboard):
    d = dashboard([503, 503, [_node(HEAD)]])
    assert [n.node_ip for n in wait_nodes_alive(d.url, TOKEN, 1, timeout=10, interval=0.01)] == [HEAD]


def test_a_refused_token_is_an_error_at_once(dashboard):
    d = dashboard([[_node(HEAD)]])
    start = time.monotonic()
    with pytest.raises(RlrunError, match="refused the token"):
        wait_nodes_alive(d.url, "wrong", 1, timeout=30, interval=0.01)
    assert time.monotonic() - start < 5


def test_the_cli_reports_the_missing_node_after_the_wait(dashboard, tmp_path, monkeypatch, capsys):
    d = dashboard([[_node(HEAD)]])
    (tmp_path / "token").write_text(TOKEN + "\n")
    monkeypatch.setenv("RLRUN_TOKEN_FILE", str(tmp_path / "token"))
    start = time.monotonic()
    rc = nodecheck.main(["--dashboard", d.url, "--expect-nodes", "2", "--expect-cpus", "2", "--wait", "1.5"])
    err = capsys.readouterr().err
    assert rc == 1 and time.monotonic() - start >= 1.5 and d.calls >= 2
    assert "problem: 1 nodes alive, the inventory expects 2" in err
    assert "problem: 1 CPUs in the cluster, the inventory expects 2" in err
    assert f"alive nodes: {HEAD}" in err


def test_the_cli_passes_once_the_nodes_have_joined(dashboard, tmp_path, monkeypatch, capsys):
    d = dashboard([[_node(HEAD)], [_node(HEAD), _node(W1)]])
    (tmp_path / "token").write_text(TOKEN)
    monkeypatch.setenv("RLRUN_TOKEN_FILE", str(tmp_path / "token"))
    assert nodecheck.main(["--dashboard", d.url, "--expect-nodes", "2", "--expect-gpus", "0", "--wait", "10"]) == 0
    assert capsys.readouterr().out.strip() == "2 nodes alive, 2 CPUs, 0 GPUs"


def test_without_wait_the_check_does_not_wait(dashboard, tmp_path, monkeypatch, capsys):
    d = dashboard([[_node(HEAD)], [_node(HEAD), _node(W1)]])
    (tmp_path / "token").write_text(TOKEN)
    monkeypatch.setenv("RLRUN_TOKEN_FILE", str(tmp_path / "token"))
    assert nodecheck.main(["--dashboard", d.url, "--expect-nodes", "2"]) == 1 and d.calls == 1
    assert "1 nodes alive, the inventory expects 2" in capsys.readouterr().err


def test_a_negative_wait_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        nodecheck.main(["--dashboard", "http://127.0.0.1:1", "--expect-nodes", "1", "--wait", "-1"])
    assert exc.value.code == 2 and "--wait -1: expected seconds >= 0" in capsys.readouterr().err
