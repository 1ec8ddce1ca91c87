"""The trainer's reward client against the real reward server (and a deliberately flaky HTTP server)."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import RewardProc, free_port
from trainer.reward.client import RemoteRewardClient, RewardServiceError, token_from_env
from trainer.reward.local import resolve_reward_fn

pytestmark = pytest.mark.integration

TOKEN = "c1" * 32
QUERIES = ["Q1 \\boxed{1/2}", "Q2 \\boxed{3}", "Q3 so the answer is 7", "Q4 \\boxed{0.25}", "Q5 no answer"]
PROMPTS = ["Q1 ", "Q2 ", "Q3 ", "Q4 ", "Q5 "]
LABELS = ["0.5", "4", "7", "\\frac{1}{4}", "2"]
EXPECTED = [1.0, 0.0, 1.0, 1.0, 0.0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("rclient")
    (d / "token").write_text(TOKEN)
    (d / "token").chmod(0o600)
    proc = RewardProc(["--token-file", str(d / "token"), "--verify-processes", "1", "--threads", "4"],
                      d / "server.log")
    yield proc.url + "/get_reward"
    assert proc.stop() == 0


def test_scores_in_order_across_several_urls(server):
    client = RemoteRewardClient([server, server], token=TOKEN)
    client.health_check()
    batch = client.score(QUERIES, PROMPTS, LABELS)
    assert batch.rewards == EXPECTED
    assert batch.extra_logs["accuracy"] == pytest.approx(0.6)


def test_more_urls_than_items(server):
    assert RemoteRewardClient([server] * 4, token=TOKEN).score(QUERIES[:2], PROMPTS[:2], LABELS[:2]).rewards == [
        1.0, 0.0]


def test_wrong_token_fails_at_once_naming_url_and_status(server):
    client = RemoteRewardClient([server], token="0" * 64, retries=3, backoff=1.0)
    started = time.monotonic()
    with pytest.raises(RewardServiceError, match=rf"{server} refused the request: HTTP 403: invalid bearer token"):
        client.score(QUERIES, PROMPTS, LABELS)
    assert time.monotonic() - started < 1.0  # not retried: retrying cannot fix a bad token


def test_missing_token_says_how_to_send_one(server):
    with pytest.raises(RewardServiceError, match=r"HTTP 401: missing Authorization header.*RLRUN_REWARD_TOKEN"):
        RemoteRewardClient([server]).score(QUERIES, PROMPTS, LABELS)


def test_unreachable_service_is_retried_with_backoff_then_named():
    url = f"http://127.0.0.1:{free_port()}/get_reward"
    client = RemoteRewardClient([url], token=TOKEN, retries=2, backoff=0.2)
    with pytest.raises(RewardServiceError, match=r"unreachable"):
        client.health_check()
    started = time.monotonic()
    with pytest.raises(RewardServiceError,
                       match=rf"{url} failed after 3 attempts: connection refused or unreachable"):
        client.score(QUERIES, PROMPTS, LABELS)
    assert time.monotonic() - started >= 0.2 + 0.4


class _Flaky(BaseHTTPRequestHandler):
    """Answers 503 to the first `fail` POSTs and to every POST before `fail_until` (monotonic), then `answer` (set
    on the server object)."""

    def do_POST(self):  # noqa: N802 (http.server's naming)
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv.requests.append(body)
        if len(srv.requests) <= srv.fail or time.monotonic() < srv.fail_until:
            payload, code = b'{"error": "warming up"}', 503
        else:
            payload, code = json.dumps(srv.answer(body)).encode(), 200
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    srv.requests, srv.fail, srv.fail_until = [], 0, 0.0
    srv.answer = lambda body: {"rewards": [0.5] * len(body["query"]), "extra_logs": {"n_items": len(body["query"])}}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}/get_reward"
    srv.shutdown()
    srv.server_close()


def test_5xx_is_retried_until_it_succeeds(flaky):
    srv, url = flaky
    srv.fail = 2
    batch = RemoteRewardClient([url], retries=3, backoff=0.01).score(["a", "b"], labels=["1", "2"])
    assert batch.rewards == [0.5, 0.5] and len(srv.requests) == 3


def test_5xx_beyond_the_retries_names_the_last_cause(flaky):
    srv, url = flaky
    srv.fail = 10
    with pytest.raises(RewardServiceError, match=r"failed after 2 attempts: HTTP 503: warming up"):
        RemoteRewardClient([url], retries=1, backoff=0.01).score(["a"])


def _client(which, url, **kw):
    from trainer.retrieval.client import RetrievalClient

    if which == "reward":
        return RemoteRewardClient([url], **kw), lambda c: c.score(["a", "b"]).rewards
    return RetrievalClient(url.replace("/get_reward", "/retrieve"), token="t", **kw), lambda c: c.search(["q"])


@pytest.mark.parametrize("which", ["reward", "retrieval"])
def test_an_outage_shorter_than_its_deadline_is_waited_out(flaky, which, capsys):
    """Issue 31: a service that answers 5xx for 1.5 s, far beyond 1 retry, is waited for (exponential backoff)
    up to --reward_outage_timeout / --retriever_outage_timeout; the job sees the answer, said so when the
    outage started and when it ended."""
    srv, url = flaky
    srv.fail_until = time.monotonic() + 1.5
    srv.answer = lambda body: ({"rewards": [1.0] * len(body["query"])} if "query" in body else
                               {"result": [[] for _ in body["queries"]]})
    client, call = _client(which, url, retries=1, backoff=0.05, outage_timeout=30)
    assert call(client) in ([1.0, 1.0], [[]])
    # waited out, and backed off rather than hammering: pauses of 0.05, 0.1, 0.2, 0.4, 0.8 ... s cover the 1.5 s
    # outage in 5-6 attempts, a fixed 0.05 s pause would take ~30
    assert 4 <= len(srv.requests) <= 10, len(srv.requests)
    out = capsys.readouterr().out
    flag = "reward_outage_timeout" if which == "reward" else "retriever_outage_timeout"
    assert f"{url if which == 'reward' else url.replace('/get_reward', '/retrieve')} is not answering (HTTP 503: " \
           f"warming up); waiting for it up to 30 s (--{flag})" in out
    assert "answers again after" in out


@pytest.mark.parametrize("which", ["reward", "retrieval"])
def test_an_outage_past_its_deadline_ends_with_one_line_naming_url_and_last_error(flaky, which):
    from trainer.retrieval.client import RetrievalError

    srv, url = flaky
    srv.fail = 10_000
    client, call = _client(which, url, retries=2, backoff=0.05, outage_timeout=1.0)
    flag = "reward_outage_timeout" if which == "reward" else "retriever_outage_timeout"
    with pytest.raises(RewardServiceError if which == "reward" else RetrievalError,
                       match=rf"service http://127.0.0.1:\d+/\w+ failed after (\d+) attempts over 1 s \(--{flag} 1\): "
                             r"HTTP 503: warming up$") as raised:
        call(client)
    # it gave up at the deadline: the attempts its message counts are the ones the service saw, as many as a
    # doubling backoff from 0.05 s fits in 1 s (5-6), not --retries 2 + 1
    attempts = int(re.search(r"failed after (\d+) attempts", str(raised.value)).group(1))
    assert attempts == len(srv.requests) and 3 <= attempts <= 8, (attempts, len(srv.requests))


def test_a_service_that_comes_back_on_its_port_is_waited_for():
    """Connection refused (the service is restarting): the request goes out again once it listens."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/get_reward"
    answered = {}

    def later():
        time.sleep(1.5)
        srv = ThreadingHTTPServer(("127.0.0.1", port), _Flaky)
        srv.requests, srv.fail, srv.fail_until = [], 0, 0.0
        srv.answer = lambda body: {"rewards": [1.0] * len(body["query"])}
        answered["srv"] = srv
        srv.serve_forever()

    threading.Thread(target=later, daemon=True).start()
    try:
        batch = RemoteRewardClient([url], retries=0, backoff=0.1, outage_timeout=30).score(["a", "b", "c"])
        assert batch.rewards == [1.0, 1.0, 1.0]
    finally:
        if "srv" in answered:
            answered["srv"].shutdown()
            answered["srv"].server_close()


@pytest.mark.parametrize("answer,message", [
    ({"rewards": [1.0]}, r"answered 1 rewards for 2 queries; expected a list of 2"),
    ({"scores": [1.0, 1.0]}, r"answered NoneType for 2 queries"),
    ({"rewards": ["x", 1.0]}, r"non-numeric rewards"),
])
def test_malformed_answers_are_refused(flaky, answer, message):
    srv, url = flaky
    srv.answer = lambda body: answer
    with pytest.raises(RewardServiceError, match=message):
        RemoteRewardClient([url], retries=0).score(["a", "b"])


def test_token_from_the_environment(tmp_path):
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    assert token_from_env({"RLRUN_REWARD_TOKEN": "direct"}) == "direct"
    assert token_from_env({"RLRUN_REWARD_TOKEN_FILE": str(f)}) == "from-file"
    # The cluster token (RAY_AUTH_TOKEN_PATH on rlrun nodes) is never sent to the reward service.
    assert token_from_env({"RAY_AUTH_TOKEN_PATH": str(f)}) is None
    assert token_from_env({}) is None
    with pytest.raises(RewardServiceError, match=r"RLRUN_REWARD_TOKEN_FILE=.*nope"):
        token_from_env({"RLRUN_REWARD_TOKEN_FILE": str(tmp_path / "nope")})


def test_local_math_verify_matches_the_service(server):
    fn = resolve_reward_fn("math_verify")
    try:
        assert fn(QUERIES, PROMPTS, LABELS).rewards == EXPECTED
    finally:
        fn.close()


def test_unknown_reward_functions_are_named():
    with pytest.raises(ValueError, match=r"unknown reward function 'nope'; expected one of "
                                         r"\['exact_match', 'f1', 'math_verify'\] or module:function"):
        resolve_reward_fn("nope")
    with pytest.raises(ValueError, match=r"'json:nothing' cannot be loaded"):
        resolve_reward_fn("json:nothing")
    assert resolve_reward_fn("json:dumps")([1]) == "[1]"


@pytest.mark.parametrize("which", ["reward", "retrieval"])
def test_a_tls_failure_is_not_retried_by_either_client(flaky, which):
    """Both clients share one request loop (trainer.services.client): a certificate that does not check out fails
    at once, naming TLS, where a connection error would be retried (here: https to a plain-HTTP server)."""
    from trainer.retrieval.client import RetrievalClient, RetrievalError

    srv, url = flaky
    url = url.replace("http://", "https://")
    started = time.monotonic()
    if which == "reward":
        with pytest.raises(RewardServiceError, match=r"reward service https://.*: TLS failed .*RLRUN_REWARD_CA_FILE"):
            RemoteRewardClient([url], retries=3, backoff=1.0).score(["a"])
    else:
        with pytest.raises(RetrievalError, match=r"retrieval service https://.*: TLS failed .*a CA this machine trusts"):
            RetrievalClient(url.replace("/get_reward", "/retrieve"), token="t", retries=3, backoff=1.0).search(["q"])
    assert time.monotonic() - started < 1.0 and srv.requests == []
