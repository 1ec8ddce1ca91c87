"""The http tool (trainer.tools.http) against a real HTTP server on loopback (http.server, threads): the JSON body
from the template, the answer's field, a bearer token from a 0600 file; the retries of trainer/services' client
(503s then an answer; the count the server saw), its deadlines (a service slower than the request timeout, one
down for good), and what reaches the model: a refused call (400) and a service still failing after the retries
are result text, a refused token (401 / 403) ends the job with one line (a Fault)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainer.deadlines import Fault
from trainer.tools.base import Call
from trainer.tools.formats import TagFormat
from trainer.tools.http import Http, HttpToolFault
from trainer.tools.registry import build_toolbox
from trainer.tools.toolbox import Toolbox

pytestmark = pytest.mark.integration

TOKEN = "http-tool-test-token"


class Service:
    """What the server does per path, and what it saw."""

    def __init__(self):
        self.requests: list[tuple[str, dict, str | None]] = []
        self.flaky_left = 2
        self.lock = threading.Lock()


@pytest.fixture(scope="module")
def server():
    service = Service()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status, body):
            data = json.dumps(body).encode() if not isinstance(body, bytes) else body
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with service.lock:
                service.requests.append((self.path, body, self.headers.get("Authorization")))
            if self.path == "/calc":
                try:
                    a, b = (int(x) for x in str(body["expression"]).split("*"))
                except (KeyError, ValueError):
                    return self._send(400, {"error": f"cannot read expression {body.get('expression')!r}"})
                return self._send(200, {"result": {"value": a * b, "text": f"{a}*{b}={a * b}"}})
            if self.path == "/flaky":
                with service.lock:
                    service.flaky_left -= 1
                    fail = service.flaky_left >= 0
                return self._send(503, {"error": "warming up"}) if fail else self._send(200, {"ok": body})
            if self.path == "/down":
                return self._send(502, {"error": "bad gateway"})
            if self.path == "/slow":
                time.sleep(1.5)
                return self._send(200, {"late": True})
            if self.path == "/auth":
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"error": "missing or wrong token"})
                return self._send(200, {"echo": body})
            if self.path == "/text":
                return self._send(200, b"plain text, not JSON")
            return self._send(404, {"error": "no such path"})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", service
    finally:
        httpd.shutdown()
        httpd.server_close()


def _box(tool: Http) -> Toolbox:
    return Toolbox([tool], TagFormat([tool]), max_calls=4)


def _seen(service: Service, path: str) -> list:
    return [r for r in service.requests if r[0] == path]


def test_a_call_is_the_template_filled_and_the_answer_field(server):
    url, service = server
    tool = Http(f"{url}/calc", name="calc", template='{"expression": "{input}", "meta": {"n": 1}}',
                result_key="result.value")
    results = _box(tool).run([Call("calc", {"input": "12*34"}), Call("calc", {"input": "12*x"}),
                              Call("calc", {"input": 'a"b\\c'})])
    assert results[0].text == "408" and not results[0].error
    assert results[1].error and "HTTP 400" in results[1].text and "cannot read expression '12*x'" in results[1].text
    assert results[2].error  # quotes and backslashes travel as text inside a JSON string, never as JSON
    bodies = [b for _, b, _ in _seen(service, "/calc")]
    assert {"expression": 'a"b\\c', "meta": {"n": 1}} in bodies and {"expression": "12*34", "meta": {"n": 1}} in bodies
    whole = Http(f"{url}/calc", template='{"expression": "{input}"}')
    (answer,) = _box(whole).run([Call("http", {"input": "2*3"})])
    assert json.loads(answer.text) == {"result": {"value": 6, "text": "2*3=6"}}
    (text,) = _box(Http(f"{url}/text")).run([Call("http", {"input": "x"})])
    assert text.text == "plain text, not JSON"


def test_503s_are_retried_with_backoff_until_the_service_answers(server):
    url, service = server
    service.flaky_left = 2
    tool = Http(f"{url}/flaky", retries=3)
    t0 = time.monotonic()
    (result,) = _box(tool).run([Call("http", {"input": "hi"})])
    assert not result.error and json.loads(result.text) == {"ok": {"input": "hi"}}
    assert len(_seen(service, "/flaky")) == 3  # two 503s, then the answer
    assert time.monotonic() - t0 >= 0.5 + 1.0 - 0.05  # backoff 0.5 s, then 1 s (the client's doubling)


def test_past_the_retries_and_the_deadline_the_model_reads_the_error(server):
    url, service = server
    down = Http(f"{url}/down", retries=1)
    before = len(_seen(service, "/down"))
    (result,) = _box(down).run([Call("http", {"input": "x"})])
    assert result.error and "failed after 2 attempts" in result.text and "HTTP 502" in result.text
    assert len(_seen(service, "/down")) - before == 2
    slow = Http(f"{url}/slow", timeout=0.3, retries=1)
    t0 = time.monotonic()
    (late,) = _box(slow).run([Call("http", {"input": "x"})])
    assert late.error and "timed out" in late.text and time.monotonic() - t0 < 0.3 * 2 + 0.5 + 1.0
    outage = Http(f"{url}/down", retries=0, outage_timeout=1.2)  # an outage waited out, then the error
    t0 = time.monotonic()
    (waited,) = _box(outage).run([Call("http", {"input": "x"})])
    assert waited.error and "--http_tool_outage_timeout 1.2" in waited.text and 1.1 < time.monotonic() - t0 < 4


def test_a_refused_token_ends_the_job_and_the_token_file_is_sent(server, tmp_path):
    url, service = server
    with pytest.raises(Fault, match="HTTP 401"):
        _box(Http(f"{url}/auth")).run([Call("http", {"input": "x"})])
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    settings = {"tools": ("http",), "max_turns": 2, "http_tool_url": f"{url}/auth", "http_tool_name": "api",
                "http_tool_template": '{"q": "{input}", "n": "{n}"}', "http_tool_result_key": "echo.q",
                "http_tool_token_file": str(token), "http_tool_timeout": 5.0, "http_tool_retries": 0,
                "http_tool_outage_timeout": 0.0}
    box = build_toolbox(settings)
    assert box.stops == ("</api>", "</answer>")
    results = box.run([Call("api", {"input": "ünï", "n": 3}), Call("api", {"input": "x"})])
    assert results[0].text == "ünï" and _seen(service, "/auth")[-1][1] == {"q": "ünï", "n": 3}
    assert results[1].error and "missing argument 'n'" in results[1].text  # the model's call lacked it
    assert _seen(service, "/auth")[-1][2] == f"Bearer {TOKEN}"
    token.chmod(0o644)
    with pytest.raises(HttpToolFault, match="accessible by group/others"):
        build_toolbox(settings).run([Call("api", {"input": "x", "n": 1})])
