"""The real retrieval service (``python -m trainer.retrieval serve`` under gunicorn) over loopback HTTP.

One service for the module (a small corpus, a token, small limits); the restart test restarts it
under a client that keeps retrying.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import free_port
from trainer.retrieval.client import RetrievalClient, RetrievalError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-retriever-5b1e9d2c7a40"
MAX_QUERIES, MAX_TOPK, MAX_BODY = 8, 5, 64 * 1024
CITIES = ["Paris", "Berlin", "Lima", "Oslo", "Quito", "Hanoi", "Dakar", "Perth", "Tunis", "Bern", "Doha", "Riga"]
PASSAGES = [{"id": f"c{i}", "contents": f'"{city}"\n{city} is a city; its river is the R{i}x{i} river.'}
            for i, city in enumerate(CITIES)]  # fmt: skip
PASSAGES.append({"id": "u", "contents": '"Zürich"\nZürich — größte Stadt der Schweiz, am Zürichsee.'})


class Service:
    def __init__(self, index: Path, token_file: Path, log: Path, port: int | None = None):
        self.index, self.token_file, self.log = index, token_file, log
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLRUN_RETRIEVER")}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer.retrieval", "serve", "--index", str(self.index),
                 "--host", "127.0.0.1", "--port", str(self.port), "--token-file", str(self.token_file),
                 "--workers", "1", "--threads", "4", "--max-queries", str(MAX_QUERIES),
                 "--max-topk", str(MAX_TOPK), "--max-body-bytes", str(MAX_BODY),
                 "--head-timeout", "3", "--body-timeout", "5"],
                cwd=ROOT, env=env, stdout=out, stderr=out)  # fmt: skip
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"service exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if requests.get(f"{self.url}/health_check", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"service did not answer /health_check in {timeout} s:\n{self.log.read_text()}")
            time.sleep(0.2)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def post(self, body: Any = None, *, raw: bytes | None = None, token: str | None = TOKEN,
             headers: dict[str, str] | None = None) -> requests.Response:  # fmt: skip
        sent = {"Content-Type": "application/json", **(headers or {})}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else json.dumps(body).encode()
        return requests.post(f"{self.url}/retrieve", data=data, headers=sent, timeout=30)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("retrieval")
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in PASSAGES), encoding="utf-8")
    build = subprocess.run([sys.executable, "-m", "trainer.retrieval", "build", "--corpus", str(corpus),
                            "--out", str(d / "index")], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert build.returncode == 0, build.stderr
    token_file = d / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    svc = Service(d / "index", token_file, d / "serve.log")
    svc.start()
    yield svc
    code = svc.stop()
    assert code == 0, f"service did not exit cleanly on SIGTERM ({code}):\n{svc.log.read_text()}"
    assert TOKEN not in svc.log.read_text()
    assert "Traceback" not in svc.log.read_text()


# ---------------------------------------------------------------- health, auth


def test_health_check_needs_no_token(service: Service) -> None:
    resp = requests.get(f"{service.url}/health_check", timeout=5)
    assert resp.status_code == 200
    body = resp.json()
    assert (body["status"], body["n_docs"], body["kind"]) == ("ok", len(PASSAGES), "bm25")
    assert (body["max_queries"], body["max_topk"], body["auth"]) == (MAX_QUERIES, MAX_TOPK, True)


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "missing Authorization header"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 401, "malformed Authorization header"),
        ({"Authorization": "Bearer "}, 401, "malformed Authorization header"),
        ({"Authorization": "Bearer wrong"}, 403, "invalid bearer token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, 403, "invalid bearer token"),
        ({"Authorization": f"Bearer {TOKEN[:-1]}"}, 403, "invalid bearer token"),
    ],
)
def test_token_is_required(service: Service, headers: dict[str, str], status: int, message: str) -> None:
    resp = service.post({"queries": ["Paris"]}, token=None, headers=headers)
    assert resp.status_code == status
    assert message in resp.json()["error"]
    assert "result" not in resp.json()
    if status == 401:
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")


# ---------------------------------------------------------------- results


def test_results_with_and_without_scores(service: Service) -> None:
    queries = ["Where is Lima?", "what is the R7x7 river", "the of and a", "größte Stadt"]
    scored = service.post({"queries": queries, "topk": 3, "return_scores": True})
    assert scored.status_code == 200, scored.text
    result = scored.json()["result"]
    assert len(result) == len(queries)
    assert result[0][0]["document"] == PASSAGES[2]  # "Lima" is only in its own passage
    assert len(result[0]) == 1  # fewer than topk: only passages with a query word
    assert result[1][0]["document"]["id"] == "c7"  # the rare token wins over "river", which every city has
    assert len(result[1]) == 3
    assert [h["score"] for h in result[1]] == sorted((h["score"] for h in result[1]), reverse=True)
    assert result[1][0]["score"] > result[1][1]["score"] > 0
    assert result[2] == []  # stop words only: no passage matches
    assert result[3][0]["document"]["contents"] == PASSAGES[-1]["contents"]  # UTF-8 kept as is
    plain = service.post({"queries": queries, "topk": 3})  # return_scores defaults to false
    assert plain.json()["result"] == [[h["document"] for h in row] for row in result]
    default_topk = service.post({"queries": ["river"]}).json()["result"]
    assert len(default_topk[0]) == 3  # Search-R1's default top-k


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"queries": ["a"', "the body is not JSON"),
        (b'"Paris"', "the body is a JSON str; expected an object"),
        (b'{"queries": "Paris"}', "'queries' is a str; expected a list of 1 to 8 strings"),
        (b'{"query": ["Paris"]}', "unknown field(s) 'query'"),
        (b'{"queries": []}', "'queries' has 0 items"),
        (json.dumps({"queries": ["x"] * (MAX_QUERIES + 1)}).encode(), "'queries' has 9 items; expected 1 to 8"),
        (b'{"queries": ["Paris", ""]}', "queries[1] is empty"),
        (b'{"queries": [["Paris"]]}', "queries[0] is a list; expected a string"),
        (b'{"queries": ["Paris"], "topk": 0}', "'topk' is 0; expected 1 to 5"),
        (b'{"queries": ["Paris"], "topk": 99}', "'topk' is 99; expected 1 to 5"),
        (b'{"queries": ["Paris"], "topk": "3"}', "'topk' is \"3\""),
        (b'{"queries": ["Paris"], "return_scores": 1}', "'return_scores' is 1; expected true or false"),
    ],
)
def test_bad_requests_get_400_with_the_reason(service: Service, body: bytes, message: str) -> None:
    resp = service.post(raw=body)
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"]


def test_too_big_bodies_wrong_paths_and_methods(service: Service) -> None:
    big = json.dumps({"queries": ["x" * (MAX_BODY // 2), "y" * (MAX_BODY // 2)]}).encode()
    resp = service.post(raw=big)
    assert resp.status_code == 413
    assert "--max-body-bytes" in resp.json()["error"]

    def chunks() -> Iterator[bytes]:
        yield b'{"queries": ["'
        for _ in range(MAX_BODY // 1024 + 8):
            yield b"z" * 1024
        yield b'"]}'

    chunked = requests.post(f"{service.url}/retrieve", data=chunks(), timeout=30,
                            headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert chunked.status_code == 413
    resp = requests.get(f"{service.url}/retrieve", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert resp.status_code == 405 and "POST /retrieve" in resp.json()["error"]
    assert "POST" in resp.headers["Allow"].split(", ")  # as the reward service: the methods there are
    resp = service.post({"queries": ["x"]}, token=TOKEN, headers={})
    assert resp.status_code == 200
    resp = requests.post(f"{service.url}/search", json={"queries": ["x"]}, timeout=5,
                         headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert resp.status_code == 404 and "no such endpoint" in resp.json()["error"]


def test_a_stalled_client_does_not_hold_the_service(service: Service) -> None:
    """Eight half-sent requests (more than the worker's threads) and a good one still goes through."""
    stalled = []
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", service.port), timeout=10)
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"queries\"")
        stalled.append(s)
    try:
        resp = service.post({"queries": ["Oslo"], "topk": 1})
        assert resp.status_code == 200 and resp.json()["result"][0][0]["id"] == "c3"
    finally:
        for s in stalled:
            s.close()
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    conn.request("GET", "/health_check")
    assert conn.getresponse().status == 200


# ---------------------------------------------------------------- the client


def test_client_batches_past_the_service_limit_in_order(service: Service) -> None:
    client = RetrievalClient(f"{service.url}/retrieve", token=TOKEN, timeout=10, retries=0)
    assert client.max_queries == MAX_QUERIES  # read from /health_check
    queries = [f"the R{i % 12}x{i % 12} river" for i in range(3 * MAX_QUERIES + 3)]  # 4 requests
    passages = client.retrieve(queries, topk=2)
    assert len(passages) == len(queries)
    for i, row in enumerate(passages):
        assert len(row) == 2
        assert row[0] == PASSAGES[i % 12]["contents"], i
    scored = client.search(queries[:2], topk=1)
    assert scored[0][0]["document"]["id"] == "c0" and scored[0][0]["score"] > 0
    # a policy's empty <search></search> gets nothing, an overlong query is cut to the service's
    # max_chars (10000 here): neither fails the batch
    mixed = client.retrieve(["", "Oslo", "   ", "Oslo " + "x" * 20_000], topk=1)
    assert mixed == [[], [PASSAGES[3]["contents"]], [], [PASSAGES[3]["contents"]]]
    with pytest.raises(TypeError, match=r"queries\[1\] is a int"):
        client.retrieve(["Oslo", 3], topk=1)  # type: ignore[list-item]


def test_client_raises_on_4xx_without_retrying(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLRUN_RETRIEVER_TOKEN", raising=False)
    monkeypatch.delenv("RLRUN_RETRIEVER_TOKEN_FILE", raising=False)
    url = f"{service.url}/retrieve"
    started = time.monotonic()
    with pytest.raises(RetrievalError, match="HTTP 403: invalid bearer token"):
        RetrievalClient(url, token="wrong", retries=5, backoff=2.0).retrieve(["Paris"], 3)
    with pytest.raises(RetrievalError, match="HTTP 401.*set RLRUN_RETRIEVER_TOKEN"):
        RetrievalClient(url, retries=5, backoff=2.0).retrieve(["Paris"], 3)
    with pytest.raises(RetrievalError, match="HTTP 400: 'topk' is 6"):
        RetrievalClient(url, token=TOKEN, retries=5, backoff=2.0).retrieve(["Paris"], MAX_TOPK + 1)
    assert time.monotonic() - started < 2.0  # no backoff sleeps: 4xx are not retried
    monkeypatch.setenv("RLRUN_RETRIEVER_TOKEN_FILE", str(service.token_file))
    assert RetrievalClient(url).retrieve(["Quito"], 1) == [[PASSAGES[4]["contents"]]]


def test_client_retries_across_a_service_restart(service: Service) -> None:
    """Runs after the other tests of the shared service: stops it and starts it again while the client retries."""
    client = RetrievalClient(f"{service.url}/retrieve", token=TOKEN, timeout=5, retries=8, backoff=0.5)
    assert client.retrieve(["Perth"], 1) == [[PASSAGES[7]["contents"]]]
    assert service.stop() == 0
    restarted = threading.Timer(1.0, service.start, kwargs={"wait": False})
    restarted.start()
    try:
        assert client.retrieve(["Perth", "Tunis"], 1) == [[PASSAGES[7]["contents"]], [PASSAGES[8]["contents"]]]
    finally:
        restarted.join()
    service.wait_healthy()
    quick = RetrievalClient(f"http://127.0.0.1:{free_port()}/retrieve", timeout=1, retries=1, backoff=0.05)
    with pytest.raises(RetrievalError, match="failed after 2 attempts: connection refused"):
        quick.retrieve(["Perth"], 1)


def test_dense_service_over_a_tiny_local_model(tmp_path: Path) -> None:
    """build --embedding-model with a self-made model, then serve it: each worker loads the model after fork."""
    from trainer.tiny import make_model

    model = make_model(tmp_path / "model", hidden_size=64, num_layers=1, num_heads=1)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in PASSAGES[:6]), encoding="utf-8")
    build = subprocess.run([sys.executable, "-m", "trainer.retrieval", "build", "--corpus", str(corpus),
                            "--out", str(tmp_path / "index"), "--embedding-model", str(model)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert build.returncode == 0, build.stderr
    assert "built (dense, 6 passages" in build.stdout
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    svc = Service(tmp_path / "index", token_file, tmp_path / "serve.log")
    svc.start()
    try:
        assert requests.get(f"{svc.url}/health_check", timeout=5).json()["kind"] == "dense"
        resp = svc.post({"queries": [PASSAGES[4]["contents"], PASSAGES[1]["contents"]], "topk": 2,
                         "return_scores": True})  # fmt: skip
        assert resp.status_code == 200, resp.text
        result = resp.json()["result"]
        assert [row[0]["document"]["id"] for row in result] == ["c4", "c1"]
        assert result[0][0]["score"] == pytest.approx(1.0, abs=1e-3) and len(result[0]) == 2
    finally:
        assert svc.stop() == 0, svc.log.read_text()


def test_local_service_serves_for_its_block_and_names_a_build_that_failed(tmp_path: Path) -> None:
    """trainer.retrieval.local, what the benchmarks and the multi-turn tests start: up for the block, gone
    after it (its PID reaped), and a corpus that cannot be indexed named in the error."""
    from trainer.retrieval.local import local_service

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    with local_service(corpus, tmp_path / "work") as svc:
        assert svc.url == f"http://127.0.0.1:{svc.port}/retrieve"
        health = requests.get(f"http://127.0.0.1:{svc.port}/health_check", timeout=10)
        assert health.ok and health.json()["n_docs"] == len(PASSAGES)
        hits = requests.post(svc.url, json={"queries": ["Lima river"], "topk": 1}, timeout=10).json()
        assert "Lima" in json.dumps(hits)
        pid = svc.pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{svc.port}/health_check", timeout=5)
    failed = pytest.raises(RuntimeError, match=r"index of .*missing\.jsonl was not built")
    with failed, local_service(tmp_path / "missing.jsonl", tmp_path / "work2"):
        pass
