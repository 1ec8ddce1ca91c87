"""The real reward server (``python -m trainer.reward.server`` under gunicorn) over loopback HTTP."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import RewardProc

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-3f9c1a7e5d2b8c40-integration"
TIMEOUT = 1.0
MAX_ITEMS = 64
MAX_CHARS = 10_000
MAX_BODY = 1024 * 1024
HEAD_TIMEOUT = 3.0
BODY_TIMEOUT = 5.0
CHAT = [
    {"role": "system", "content": "Reason step by step."},
    {"role": "user", "content": "What is 1/2 + 1/4?"},
]
CHATML = (
    "<|im_start|>system\nReason step by step.<|im_end|>\n"
    "<|im_start|>user\nWhat is 1/2 + 1/4?<|im_end|>\n<|im_start|>assistant\n"
)
PLAIN_CHATML = "<|im_start|>user\nHow many legs has a cat?<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    bodies: list[str] = field(default_factory=list)  # every response body, for the traceback check

    def post(self, body: Any = None, *, raw: bytes | None = None, token: str | None = TOKEN, timeout: float = 30,
             **kw: Any):
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else json.dumps(body).encode()
        resp = requests.post(f"{self.url}/get_reward", data=data, headers=headers, timeout=timeout, **kw)
        self.bodies.append(resp.text)
        return resp


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RLRUN_REWARD_TOKEN"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.reward.server", *args],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("reward")
    token = d / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    dataset = d / "train.jsonl"
    records = [{"message": CHAT, "answer": "3/4"}, {"message": "How many legs has a cat?", "label": 4}]
    dataset.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return {"dir": d, "token": token, "dataset": dataset}


@pytest.fixture(scope="module")
def server(files: dict[str, Path]) -> Iterator[Server]:
    log = files["dir"] / "server.log"
    args = [
        "--token-file", str(files["token"]),
        "--dataset", str(files["dataset"]), "--input_key", "message", "--prompt-template", "chatml",
        "--workers", "1", "--threads", "4", "--verify-processes", "2", "--timeout", str(TIMEOUT),
        "--max-items", str(MAX_ITEMS), "--max-chars", str(MAX_CHARS), "--max-body-bytes", str(MAX_BODY),
        "--head-timeout", str(HEAD_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
    ]  # fmt: skip
    try:
        proc = RewardProc(args, log, env=_env())
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield Server(proc.url, proc.proc, log)
    code = proc.stop()
    assert code == 0, f"server did not exit cleanly on SIGTERM ({code}):\n{log.read_text()}"
    assert TOKEN not in log.read_text()


# ---------------------------------------------------------------- health and auth


def test_health_check_needs_no_auth(server: Server) -> None:
    resp = requests.get(f"{server.url}/health_check", timeout=5)
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "ok"
    assert body["auth"] is True
    assert body["dataset_items"] == 2
    assert body["pool"]["alive"] >= 2


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "missing Authorization header"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 401, "malformed Authorization header"),
        ({"Authorization": "Bearer"}, 401, "malformed Authorization header"),
        ({"Authorization": "Bearer wrong-token"}, 403, "invalid bearer token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, 403, "invalid bearer token"),
    ],
)
def test_auth_rejections(server: Server, headers: dict[str, str], status: int, message: str) -> None:
    resp = server.post({"query": ["x"], "labels": ["1"]}, token=None, headers=headers)
    assert resp.status_code == status
    assert message in resp.json()["error"]
    if status == 401:
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")


def test_right_token_and_acceptance_example(server: Server) -> None:
    resp = server.post(
        {"query": ["What is 1/2? ... \\boxed{1/2}"], "prompts": ["What is 1/2?"], "labels": ["0.5"]}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["rewards"] == [1.0]
    assert body["scores"] == [1.0]
    assert body["extra_logs"]["reason"] == ["correct:boxed"]
    assert body["extra_logs"]["extracted"] == ["1/2"]
    assert body["extra_logs"]["accuracy"] == 1.0


def test_mixed_batch_and_numeric_labels(server: Server) -> None:
    queries = ["P1 \\boxed{4}", "P2 \\boxed{5}", "P3 no answer", "P4 \\boxed{\\sqrt{8}}", "P5 \\boxed{}"]
    prompts = ["P1", "P2", "P3", "P4", "P5"]
    labels: list[Any] = [4, 4.0, "1", "2\\sqrt{2}", "1"]
    body = server.post({"query": queries, "prompts": prompts, "labels": labels}).json()
    assert body["rewards"] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert body["extra_logs"]["reason"] == ["correct:boxed", "wrong:boxed", "no_answer", "correct:boxed", "no_answer:boxed"]
    assert body["extra_logs"]["n_no_answer"] == 2
    assert body["extra_logs"]["n_items"] == 5


def test_dataset_lookup_without_labels(server: Server) -> None:
    queries = [
        CHATML + "1/2 + 1/4 = \\boxed{\\frac{3}{4}}",
        PLAIN_CHATML + "A cat has \\boxed{4} legs.",
        "<pad><pad>" + PLAIN_CHATML + "\\boxed{3}",  # left padding before the prompt
        "Unknown prompt \\boxed{1}",
    ]
    prompts = [CHATML, PLAIN_CHATML, PLAIN_CHATML, "Unknown prompt"]
    body = server.post({"query": queries, "prompts": prompts}).json()
    assert body["rewards"] == [1.0, 1.0, 0.0, 0.0]
    assert body["extra_logs"]["reason"] == ["correct:boxed", "correct:boxed", "wrong:boxed", "no_label"]
    assert body["extra_logs"]["labels_from_dataset"] == 3
    assert body["extra_logs"]["n_no_label"] == 1


def test_empty_labels_fall_back_to_dataset(server: Server) -> None:
    body = server.post({"query": [CHATML + "\\boxed{0.75}"], "prompts": [CHATML], "labels": [""]}).json()
    assert body["rewards"] == [1.0]


def test_response_is_query_minus_prompt(server: Server) -> None:
    """The prompt's own box must not be graded: only what follows the prompt is the response."""
    prompt = "Example: \\boxed{7}. Now solve 2+2."
    body = server.post({"query": [prompt + " I am not sure."], "prompts": [prompt], "labels": ["7"]}).json()
    assert body["extra_logs"]["reason"] == ["no_answer"]


# ---------------------------------------------------------------- bad requests

BAD_REQUESTS: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("not json", b"{not json", {}, 400, "not valid JSON"),
    ("empty body", b"", {}, 400, "request body is empty"),
    ("not utf-8", b'{"query": ["\xff\xfe"]}', {}, 400, "not valid UTF-8"),
    ("array body", b"[1, 2]", {}, 400, "must be a JSON object; got array"),
    ("missing query", b'{"labels": ["1"]}', {}, 400, "'query' is required"),
    ("query not array", b'{"query": "abc", "labels": ["1"]}', {}, 400, "'query' must be an array; got string"),
    ("query empty", b'{"query": []}', {}, 400, "'query' is empty"),
    ("query item type", b'{"query": ["a", 5], "labels": ["1", "2"]}', {}, 400, "'query[1]' must be a string; got number"),
    ("unknown key", b'{"query": ["a"], "labels": ["1"], "foo": 1}', {}, 400, "unknown top-level key(s) 'foo'"),
    ("prompts length", b'{"query": ["a"], "prompts": ["a", "b"]}', {}, 400, "'prompts' has 2 items but 'query' has 1"),
    ("labels length", b'{"query": ["a", "b"], "labels": ["1"]}', {}, 400, "'labels' has 1 items but 'query' has 2"),
    ("prompt item type", b'{"query": ["a"], "prompts": [{}]}', {}, 400, "'prompts[0]' must be a string; got object"),
    ("label bool", b'{"query": ["a"], "labels": [true]}', {}, 400, "'labels[0]' must be a string, a number or null; got boolean"),
    ("label array", b'{"query": ["a"], "labels": [[1]]}', {}, 400, "'labels[0]' must be a string, a number or null; got array"),
    ("labels not array", b'{"query": ["a"], "labels": "1"}', {}, 400, "'labels' must be an array; got string"),
    ("NaN label", b'{"query": ["a"], "labels": [NaN]}', {}, 400, "NaN is not valid JSON"),
    ("no labels no prompts", b'{"query": ["a"]}', {}, 400, "'prompts' is required"),
    ("too many items", json.dumps({"query": ["a"] * (MAX_ITEMS + 1), "labels": ["1"] * (MAX_ITEMS + 1)}).encode(), {}, 413, f"the limit is {MAX_ITEMS} per request"),
    ("string too long", json.dumps({"query": ["a" * (MAX_CHARS + 1)], "labels": ["1"]}).encode(), {}, 413, f"'query[0]' is {MAX_CHARS + 1} characters long"),
    ("wrong content type", b'{"query": ["a"], "labels": ["1"]}', {"Content-Type": "text/plain"}, 415, "Content-Type must be application/json"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "headers", "status", "message"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_requests_name_the_problem(
    server: Server, raw: bytes, headers: dict, status: int, message: str
) -> None:
    resp = server.post(raw=raw, headers=headers)
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    assert message in resp.json()["error"]


def test_at_least_15_kinds_of_bad_request() -> None:
    assert len({case[0] for case in BAD_REQUESTS}) >= 15


def test_unknown_path_and_method_are_json(server: Server) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    resp = requests.get(f"{server.url}/nope", headers=auth, timeout=5)
    assert resp.status_code == 404
    assert "no such endpoint '/nope'" in resp.json()["error"]
    resp = requests.get(f"{server.url}/get_reward", headers=auth, timeout=5)
    assert resp.status_code == 405
    assert "method GET is not allowed" in resp.json()["error"]
    assert "POST" in resp.headers["Allow"].split(", ")
    server.bodies += [resp.text]


def test_oversize_body_is_413(server: Server) -> None:
    # Several times what loopback buffers hold: the client is still sending when the server
    # decides; it must still read the 413, not a broken pipe.
    resp = server.post(raw=b'{"query": ["' + b"x" * (8 * MAX_BODY) + b'"]}')
    assert resp.status_code == 413
    assert "larger than" in resp.json()["error"]
    # Announced size: answered from the headers alone, before any body byte is sent.
    conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=10)
    conn.putrequest("POST", "/get_reward")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(50 * MAX_BODY))
    conn.endheaders()
    raw = conn.getresponse()
    assert raw.status == 413
    conn.close()


def test_oversize_chunked_body_is_413(server: Server) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"query": ["'
        for _ in range(MAX_BODY // 65536 + 2):
            yield b"x" * 65536
        yield b'"]}'

    resp = requests.post(
        f"{server.url}/get_reward",
        data=chunks(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        timeout=30,
    )
    server.bodies.append(resp.text)
    assert resp.status_code == 413
    assert "larger than" in resp.json()["error"]


# ---------------------------------------------------------------- timeouts


def test_pathological_items_time_out_without_delaying_the_batch(server: Server) -> None:
    good = [(rf"\boxed{{\sqrt{{{n}}}}}", rf"\sqrt{{{n}}}") for n in range(2, 22)]  # need sympy
    # sympy factors these ~10^4-digit radicands for minutes (towers are caught earlier, see below)
    bad = [(rf"\boxed{{\sqrt{{10^{{{n}}}+1}}}}", "1") for n in (9999, 9997)]
    items = good[:5] + bad[:1] + good[5:15] + bad[1:] + good[15:]
    started = time.monotonic()
    resp = server.post({"query": [r for r, _ in items], "labels": [lbl for _, lbl in items]})
    elapsed = time.monotonic() - started
    assert resp.status_code == 200
    body = resp.json()
    reasons = body["extra_logs"]["reason"]
    assert reasons[5] == "timeout:boxed" and reasons[16] == "timeout:boxed"
    assert body["rewards"][5] == 0.0 and body["rewards"][16] == 0.0
    assert [r for i, r in enumerate(reasons) if i not in (5, 16)] == ["correct:boxed"] * 20
    assert body["extra_logs"]["n_timeout"] == 2
    # Each hang used its CPU budget side by side with the other; no wall-clock backstop retry.
    assert elapsed < 2 * TIMEOUT + 30, f"batch took {elapsed:.2f}s"
    tower = server.post({"query": [r"\boxed{9^{9^{9^{9}}}}"], "labels": ["1"]}).json()
    assert tower["extra_logs"]["reason"] == ["too_complex:boxed"]
    health = requests.get(f"{server.url}/health_check", timeout=5).json()
    assert health["pool"]["timeouts"] >= 2
    assert health["pool"]["alive"] <= health["pool"]["max_processes"]


# ---------------------------------------------------------------- what scored, and peers' cases


def test_reason_tells_which_path_scored(server: Server) -> None:
    queries = [
        "Two pairs are 2 * 2 = 4 socks.\n#### 4<|im_end|>",
        "She has 16 - 3 - 4 = 9 eggs and sells them at $2 each, making $18 every day.<|endoftext|>",
        "<answer>The answer is 15.</answer><｜end▁of▁sentence｜>",
        r"So $x = \boxed{5}$.</s>",
        "I do not know.<|im_end|>",
    ]
    body = server.post({"query": queries, "labels": ["4", "18", "15", "5", "3"]}).json()
    assert body["rewards"] == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert body["extra_logs"]["reason"] == [
        "correct:hash", "correct:final_expression", "correct:answer_tag", "correct:boxed", "no_answer",
    ]  # fmt: skip
    assert body["extra_logs"]["n_unmarked"] == 1


def test_peer_cases_score_over_http_as_in_process(server: Server) -> None:
    """The deployed service gives every peer-derived case the verdict the library gives in-process."""
    from tests.reward_peer_cases import CASES
    from trainer.reward.math import score_response

    rewards: list[float] = []
    for lo in range(0, len(CASES), MAX_ITEMS):
        chunk = CASES[lo : lo + MAX_ITEMS]
        resp = server.post({"query": [c.response for c in chunk], "labels": [c.label for c in chunk]})
        assert resp.status_code == 200, resp.text
        rewards += resp.json()["rewards"]
    local = [score_response(c.response, c.label).score for c in CASES]
    assert rewards == local


# ---------------------------------------------------------------- slow and idle clients


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


SLOW_KINDS = {
    "nothing": b"",
    "half a request line": b"POST /get_rew",
    "headers without their end": (
        f"POST /get_reward HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: app"
    ).encode(),
    "part of the body": (
        f"POST /get_reward HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        'Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{"query": ["\\\\boxed{1}"], '
    ).encode(),
}


def _slow_clients(server: Server, n: int) -> list[tuple[str, socket.socket]]:
    """``n`` connections that each stop somewhere in their request (what used to hold a thread each)."""
    kinds = list(SLOW_KINDS.items())
    clients = []
    for i in range(n):
        kind, data = kinds[i % len(kinds)]
        sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=5)
        if data:
            sock.sendall(data)
        clients.append((kind, sock))
    return clients


def _still_open(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_200_idle_connections_do_not_starve_others(server: Server) -> None:
    clients = _slow_clients(server, 200)
    try:
        started = time.monotonic()
        latencies = []
        for _ in range(60):
            t = time.perf_counter()
            resp = requests.get(f"{server.url}/health_check", timeout=5)
            latencies.append(time.perf_counter() - t)
            assert resp.status_code == 200
        labels = [str(n) for n in range(2, 22)]
        body = server.post({"query": [rf"\boxed{{\sqrt{{{n}}}^2}}" for n in labels], "labels": labels}).json()
        assert body["rewards"] == [1.0] * len(labels)
        assert time.monotonic() - started < HEAD_TIMEOUT, "the slow clients must still be connected"
        assert all(_still_open(sock) for _, sock in clients)
        latencies.sort()
        print(f"/health_check with 200 idle connections: p50 {latencies[30] * 1000:.1f} ms, "
              f"p99 {latencies[-1] * 1000:.1f} ms")  # fmt: skip
    finally:
        for _, sock in clients:
            sock.close()


def test_slow_clients_get_408_and_are_closed(server: Server) -> None:
    clients = _slow_clients(server, len(SLOW_KINDS))
    try:
        time.sleep(BODY_TIMEOUT + 1.5)  # deadlines are checked at least once a second
        for kind, sock in clients:
            sock.settimeout(2)
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408"), (kind, answer[:80])
            rest = sock.recv(4096)
            while rest:
                rest = sock.recv(4096)  # then EOF: the server closed it
    finally:
        for _, sock in clients:
            sock.close()
    assert "closed a slow connection from ('127.0.0.1'" in server.log.read_text()


def test_failed_auth_is_logged_with_the_peer_and_rate_limited(server: Server) -> None:
    from trainer.services.app import AUTH_LOG_PER_MINUTE

    def refusals() -> int:
        return server.log.read_text().count("refused POST /get_reward from 127.0.0.1: HTTP 403 (wrong token)")

    before = refusals()
    for _ in range(3 * AUTH_LOG_PER_MINUTE):
        assert server.post({"query": ["x"], "labels": ["1"]}, token="not-the-token").status_code == 403
    time.sleep(0.5)  # the log is written by another process
    logged = refusals() - before
    assert logged >= 1
    assert logged < 3 * AUTH_LOG_PER_MINUTE, "every refusal was logged: no rate limit"
    assert "not-the-token" not in server.log.read_text()


# ---------------------------------------------------------------- a busy machine


def _symbolic_items(n: int) -> list[tuple[str, str]]:
    """``n`` distinct correct answers that each need sympy, for 10-250 ms of CPU on an idle machine."""
    families = [
        lambda k: (rf"\tan^2({k}y)+1", rf"\sec^2({k}y)"),
        lambda k: (rf"[-\frac{{{k}}}{{2}}, \sqrt{{{k}}})", rf"[-{k}/2, \sqrt{{{k}}})"),
        lambda k: (rf"\{{1+\sqrt{{{k}}}, 1-\sqrt{{{k}}}\}}", rf"1\pm\sqrt{{{k}}}"),
        lambda k: (rf"(x+{k})^2", rf"x^2+{2 * k}x+{k * k}"),
        lambda k: (rf"(x+{k})(x-{k})", rf"x^2-{k * k}"),
        lambda k: (rf"y={k}x+{k + 1}", rf"y - {k + 1} = {k}x"),
        lambda k: (rf"\frac{{{k}\sqrt{{3}}}}{{3}}", rf"\frac{{{k}}}{{\sqrt{{3}}}}"),
        lambda k: (rf"\begin{{pmatrix}} {k} & \frac12 \\ 0 & 1 \end{{pmatrix}}",
                   rf"\begin{{pmatrix}} {k} & 0.5 \\ 0 & 1 \end{{pmatrix}}"),
    ]  # fmt: skip
    return [(rf"So the answer is $\boxed{{{a}}}$.", lbl)
            for a, lbl in (families[i % len(families)](i // len(families) + 2) for i in range(n))]  # fmt: skip


def test_correct_answers_score_1_under_4x_cpu_oversubscription(server: Server) -> None:
    """Busy processes (4 per CPU, started here, ended by PID) must not turn correct answers into 0. What is
    asked is the scores, not how soon they come: on the 2-core CI machine with the other lane's clusters beside
    the hogs, a request of 64 sympy items took over 30 s of wall time (2026-11-29), so the client waits longer.
    The server's own budgets (CPU seconds an item, its wall-clock backstop) are what the test holds to."""
    cpus = len(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4 * cpus)]
    try:
        items = _symbolic_items(96)
        rewards: list[float] = []
        reasons: list[str] = []
        for lo in range(0, len(items), MAX_ITEMS):
            chunk = items[lo : lo + MAX_ITEMS]
            resp = server.post({"query": [r for r, _ in chunk], "labels": [lbl for _, lbl in chunk]}, timeout=300)
            assert resp.status_code == 200, resp.text
            rewards += resp.json()["rewards"]
            reasons += resp.json()["extra_logs"]["reason"]
        assert all(hog.poll() is None for hog in hogs), "the machine was not kept busy throughout"
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    wrong = [(items[i][0], reasons[i]) for i, r in enumerate(rewards) if r != 1.0]
    assert not wrong, f"{len(wrong)} correct answers scored 0 under load: {wrong[:5]}"


# ---------------------------------------------------------------- hygiene (run last)


def test_no_traceback_in_any_response(server: Server) -> None:
    assert server.bodies, "earlier tests should have recorded responses"
    for text in server.bodies:
        assert "Traceback" not in text
        assert 'File "' not in text


def test_server_log_has_no_token(server: Server) -> None:
    text = server.log.read_text()
    assert "get_reward items=" in text  # the log is being written
    assert TOKEN not in text
    assert "Authorization" not in text


# ---------------------------------------------------------------- command line


def test_cli_bad_arguments_one_line_exit_2(files: dict[str, Path]) -> None:
    loose = files["dir"] / "loose-token"
    loose.write_text(TOKEN)
    loose.chmod(0o644)
    cases = [
        (
            ["--dataset", str(files["dir"] / "missing.jsonl"), "--token-file", str(files["token"])],
            "no such file",
        ),
        (["--port", "70000", "--no-auth"], "out of range"),
        (["--port", "http", "--no-auth"], "not a number"),
        (["--token-file", str(files["dir"] / "nope")], "--token-file"),
        (["--token-file", str(loose)], "chmod 600"),
        ([], "no token is configured"),
        (["--no-auth", "--extract", "boxed,magic"], "unknown extraction strategy 'magic'"),
        (["--no-auth", "--lenient", "units,unit"], "unknown leniency 'unit'"),
        (["--dataset", str(files["dataset"]), "--input_key", "prompt", "--no-auth"], "no 'prompt' field"),
    ]
    for args, message in cases:
        result = _cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert message in lines[0], (args, lines[0])
        assert TOKEN not in result.stderr


def test_input_key_spellings_are_equivalent() -> None:
    from trainer.reward.server.__main__ import build_parser

    a = build_parser().parse_args(["--input_key", "m", "--prompt-template", "chatml", "--no-auth"])
    b = build_parser().parse_args(["--input-key", "m", "--prompt_template", "chatml", "--no-auth"])
    assert (a.input_key, a.prompt_template) == (b.input_key, b.prompt_template) == ("m", "chatml")


# ---------------------------------------------------------------- app factory, in-process


def test_lenient_reaches_the_verifier_from_the_command_line() -> None:
    """--lenient (the role's reward_server__lenient) is the pool's comparison: units off, 2\\pi cm is not 2\\pi."""
    from trainer.reward.server import create_app
    from trainer.reward.server.__main__ import build_parser, config_from_args
    from trainer.reward.server.app import EXTENSION

    body = {"query": [r"The arc is $\boxed{2\pi cm}$.", r"The set is $\boxed{\mathcal{B}}$."], "labels": [r"2\pi", "B"]}
    expected = {"units,styled_letters": [1.0, 1.0], "styled_letters": [0.0, 1.0], "none": [0.0, 0.0]}
    for lenient, rewards in expected.items():
        config = config_from_args(build_parser().parse_args(["--no-auth", "--verify-processes", "1", "--lenient", lenient]))
        app = create_app(config)
        try:
            answer = app.test_client().post("/get_reward", json=body)
            assert answer.status_code == 200, answer.get_data(as_text=True)
            assert answer.get_json()["rewards"] == rewards, lenient
        finally:
            app.extensions[EXTENSION].pool.close()


def test_create_app_refuses_without_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.reward.server import ServerConfig, ServiceConfigError, create_app

    monkeypatch.delenv("RLRUN_REWARD_TOKEN", raising=False)
    with pytest.raises(ServiceConfigError, match="no token is configured"):
        create_app(ServerConfig())


def test_no_auth_warns_and_internal_errors_are_opaque(caplog: pytest.LogCaptureFixture) -> None:
    from trainer.reward.pool import VerifyPool
    from trainer.reward.server import ServerConfig, create_app

    with VerifyPool(processes=1, timeout=TIMEOUT) as pool:
        with caplog.at_level("WARNING"):
            app = create_app(ServerConfig(auth=False), pool=pool)
        assert "authentication is DISABLED" in caplog.text
        client = app.test_client()
        ok = client.post("/get_reward", json={"query": ["\\boxed{2}"], "labels": ["2"]})
        assert ok.status_code == 200 and ok.get_json()["rewards"] == [1.0]
        no_dataset = client.post("/get_reward", json={"query": ["\\boxed{2}"]})
        assert no_dataset.status_code == 400
        assert "'labels' is required" in no_dataset.get_json()["error"]

        def boom(*_: Any) -> None:
            raise RuntimeError("secret internals /etc/passwd")

        pool.score = boom  # type: ignore[method-assign]
        with caplog.at_level("ERROR"):
            failed = client.post("/get_reward", json={"query": ["x"], "labels": ["1"]})
        assert failed.status_code == 500
        assert failed.get_json() == {"error": "internal error"}
        assert "secret internals" not in failed.get_data(as_text=True)
        assert "secret internals" in caplog.text  # logged server-side


# ---------------------------------------------------------------- HTTPS with the cluster's CA


@pytest.fixture(scope="module")
def tls_server(files: dict[str, Path]) -> Iterator[tuple[str, Path]]:
    """The server over HTTPS, with a CA and certificate from the cluster role's own script."""
    script = ROOT / "roles" / "cluster" / "files" / "reward_tls.sh"
    store = files["dir"] / "tls"
    for args in (["ca", str(store), "test"], ["host", str(store), "rewardhost", "127.0.0.1"]):
        subprocess.run([str(script), *args], check=True, capture_output=True, timeout=60)
    args = ["--token-file", str(files["token"]), "--verify-processes", "1", "--threads", "2",
            "--certfile", str(store / "rewardhost-127.0.0.1.crt"), "--keyfile", str(store / "rewardhost-127.0.0.1.key")]
    log = files["dir"] / "tls-server.log"
    proc = RewardProc(args, log, env=_env(), scheme="https", ca=str(store / "ca.crt"))
    yield proc.url, store / "ca.crt"
    assert proc.stop() == 0, log.read_text()


def test_https_with_the_clusters_ca(tls_server: tuple[str, Path]) -> None:
    from rlrun.dashboard import reward_health
    from trainer.reward.client import RemoteRewardClient, RewardServiceError

    url, ca = tls_server
    assert url.startswith("https://")
    client = RemoteRewardClient([f"{url}/get_reward"], token=TOKEN, ca_file=str(ca), retries=0)
    assert client.score([r"so \boxed{7}"], labels=["7"]).rewards == [1.0]
    untrusting = RemoteRewardClient([f"{url}/get_reward"], token=TOKEN, retries=0)  # the system's CAs only
    with pytest.raises(RewardServiceError, match="TLS failed"):
        untrusting.score(["x"], labels=["1"])
    assert reward_health(f"{url}/get_reward", token=TOKEN, ca=str(ca)) == "ok"
    assert reward_health(f"{url}/get_reward", token="not-it", ca=str(ca)) == "refuses the reward token (HTTP 403)"
    assert reward_health(f"{url}/get_reward", token=TOKEN).startswith("TLS failed")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(url.replace("https:", "http:") + "/health_check", timeout=5)


def test_https_handshakes_do_not_hold_threads(tls_server: tuple[str, Path]) -> None:
    """Connections that never start (or never finish) their TLS handshake cost no thread."""
    url, ca = tls_server
    port = int(url.rsplit(":", 1)[1])
    stalled = []
    try:
        for i in range(40):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                sock.sendall(b"\x16\x03\x01\x00\xa5\x01\x00")  # the start of a ClientHello, then nothing
            stalled.append(sock)
        for _ in range(5):
            assert requests.get(f"{url}/health_check", verify=str(ca), timeout=5).status_code == 200
    finally:
        for sock in stalled:
            sock.close()
