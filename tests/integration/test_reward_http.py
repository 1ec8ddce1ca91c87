"""The real reward server (``python -m trainer.reward.server`` under gunicorn) over loopback HTTP."""

from __future__ import annotations

import http.client
import json
import os
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
SLACK = 2.0
MAX_ITEMS = 64
MAX_CHARS = 10_000
MAX_BODY = 1024 * 1024
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

    def post(self, body: Any = None, *, raw: bytes | None = None, token: str | None = TOKEN, **kw: Any):
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else json.dumps(body).encode()
        resp = requests.post(f"{self.url}/get_reward", data=data, headers=headers, timeout=30, **kw)
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
    assert body["extra_logs"]["reason"] == ["correct"]
    assert body["extra_logs"]["extracted"] == ["1/2"]
    assert body["extra_logs"]["accuracy"] == 1.0


def test_mixed_batch_and_numeric_labels(server: Server) -> None:
    queries = ["P1 \\boxed{4}", "P2 \\boxed{5}", "P3 no answer", "P4 \\boxed{\\sqrt{8}}", "P5 \\boxed{}"]
    prompts = ["P1", "P2", "P3", "P4", "P5"]
    labels: list[Any] = [4, 4.0, "1", "2\\sqrt{2}", "1"]
    body = server.post({"query": queries, "prompts": prompts, "labels": labels}).json()
    assert body["rewards"] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert body["extra_logs"]["reason"] == ["correct", "wrong", "no_answer", "correct", "no_answer"]
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
    assert body["extra_logs"]["reason"] == ["correct", "correct", "wrong", "no_label"]
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
    server.bodies += [resp.text]


def test_oversize_body_is_413(server: Server) -> None:
    resp = server.post(raw=b'{"query": ["' + b"x" * (MAX_BODY + 10) + b'"]}')
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
    assert reasons[5] == "timeout" and reasons[16] == "timeout"
    assert body["rewards"][5] == 0.0 and body["rewards"][16] == 0.0
    assert [r for i, r in enumerate(reasons) if i not in (5, 16)] == ["correct"] * 20
    assert body["extra_logs"]["n_timeout"] == 2
    assert elapsed <= TIMEOUT + SLACK, f"batch took {elapsed:.2f}s"
    tower = server.post({"query": [r"\boxed{9^{9^{9^{9}}}}"], "labels": ["1"]}).json()
    assert tower["extra_logs"]["reason"] == ["too_complex"]
    health = requests.get(f"{server.url}/health_check", timeout=5).json()
    assert health["pool"]["timeouts"] >= 2
    assert health["pool"]["alive"] <= health["pool"]["max_processes"]


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


def test_create_app_refuses_without_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.reward.server import ConfigError, ServerConfig, create_app

    monkeypatch.delenv("RLRUN_REWARD_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="no token is configured"):
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
