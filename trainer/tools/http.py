"""The HTTP tool: a service of your own (a calculator, a web API, a remote code sandbox such as SandboxFusion)
described in the job's config, called as ``<NAME>input</NAME>`` (``--http_tool_name``, default ``http``) or as a
JSON-format call with arguments.

- ``--http_tool_url``: the endpoint; each call is one ``POST`` of a JSON body (``{node_ip}`` in the URL: the
  engine's node, as ``--retriever_url``).
- ``--http_tool_template``: the body as JSON text whose string values may hold ``{NAME}``, replaced by the
  call's argument NAME (the tag format's body is ``input``); e.g. ``{"expression": "{input}"}``. The
  arguments go in as text inside JSON strings (JSON-escaped by the encoder, never spliced into JSON text).
- ``--http_tool_result_key``: a dotted path to the answer's field the model reads (``result.text``); default:
  the whole answer (compact JSON, or the body when it is not JSON).
- ``--http_tool_token_file``: a bearer token file (read once, in the engine's process).
- Requests are :class:`trainer.services.client.ServiceClient`'s: ``--http_tool_timeout`` per request,
  ``--http_tool_retries`` retries with exponential backoff on connection errors, timeouts and 5xx, and up to
  ``--http_tool_outage_timeout`` seconds of an outage waited out. The calls of a batch go out in parallel.

What the model reads: the answer; or ``error: ...`` for a 4xx answer other than 401/403 (the service refused
this call's arguments: its message), and for a service still failing once the retries and the outage deadline
ran out (the call's deadline). A 401 or 403 (the job's token), a TLS failure and a bad template end the job
with one line: no call of this job could succeed, and the model must not learn that the tool fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from trainer.deadlines import Fault
from trainer.services.client import ServiceClient, ServiceError
from trainer.services.token import load_token_file
from trainer.tools.base import Tool, ToolError

_FIELD = re.compile(r"\{([A-Za-z_]\w*)\}")
PARALLEL = 8


class HttpToolError(ServiceError):
    """A request to the HTTP tool's service failed (see the module docstring for which reach the model)."""


class HttpToolFault(Fault):
    """The HTTP tool cannot work for this job (token refused, TLS, a bad template): the job's one line."""


class HttpToolClient(ServiceClient):
    what = "HTTP tool"
    error = HttpToolError
    hints = {401: " (--http_tool_token_file: no token, or not the service's)", 403: " (the token is not accepted)"}
    outage_flag = "http_tool_outage_timeout"


def template_fields(template: str) -> tuple[Any, list[str]]:
    """The parsed body template and the argument names its strings use; ValueError naming what is wrong."""
    try:
        body = json.loads(template)
    except ValueError as e:
        raise ValueError(f"--http_tool_template {template!r} is not JSON: {e}") from None
    names: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            names.extend(n for n in _FIELD.findall(value) if n not in names)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(body)
    return body, names


def fill(body: Any, args: Mapping[str, Any]) -> Any:
    """``body`` with every ``{NAME}`` in its strings replaced by ``args[NAME]`` (as text); a string that is
    exactly ``{NAME}`` takes the argument's JSON value (a number stays a number)."""
    if isinstance(body, str):
        whole = _FIELD.fullmatch(body)
        if whole:
            return _arg(args, whole.group(1))
        return _FIELD.sub(lambda m: _text(_arg(args, m.group(1))), body)
    if isinstance(body, dict):
        return {k: fill(v, args) for k, v in body.items()}
    if isinstance(body, list):
        return [fill(v, args) for v in body]
    return body


def _arg(args: Mapping[str, Any], name: str) -> Any:
    if name not in args:
        raise ToolError(f"missing argument {name!r}; the call has {', '.join(sorted(args)) or 'none'}")
    return args[name]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def pick(answer: Any, key: str | None) -> str:
    """The answer's field at the dotted path ``key`` as text (the whole answer when None)."""
    value = answer
    if key:
        for part in key.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise ToolError(f"the answer has no {key!r}: {json.dumps(answer, ensure_ascii=False)[:200]}")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Http(Tool):
    arg: ClassVar[str] = "input"
    description: ClassVar[str] = "Call the job's HTTP service; its answer comes back."
    timeout = None  # the client's timeout, retries and outage deadline bound a call

    def __init__(self, url: str, *, name: str = "http", template: str = '{"input": "{input}"}',
                 result_key: str | None = None, token: str | None = None, timeout: float = 10.0, retries: int = 2,
                 outage_timeout: float = 0.0) -> None:
        from trainer.rollout.multiturn import resolve_node_url

        self.name = name
        self.url = resolve_node_url(url)
        self.body, self.fields = template_fields(template)
        self.result_key = result_key
        self.client = HttpToolClient(token=token, timeout=timeout, retries=retries, backoff=0.5,
                                     outage_timeout=outage_timeout)
        self._pool: ThreadPoolExecutor | None = None
        self.token_file: str | None = None  # read at the first call

    @property
    def parameters(self) -> dict[str, Any]:
        names = self.fields or [self.arg]
        return {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": names}

    @classmethod
    def from_settings(cls, s: Mapping[str, Any]) -> Http:
        """The tool the job's flags describe; its token file is read at the first call (in the engine's
        process: building the tool elsewhere, for the prompts' schemas, reads nothing)."""
        try:
            tool = cls(s["http_tool_url"], name=s["http_tool_name"], template=s["http_tool_template"],
                       result_key=s["http_tool_result_key"], timeout=s["http_tool_timeout"],
                       retries=s["http_tool_retries"], outage_timeout=s["http_tool_outage_timeout"])
        except ValueError as e:
            raise HttpToolFault(f"HTTP tool: {e}") from None
        tool.token_file = s.get("http_tool_token_file")
        return tool

    def _read_token(self) -> None:
        if self.token_file:
            try:
                token = load_token_file(self.token_file)
            except Exception as e:  # noqa: BLE001 - the service module's ConfigError: a one-line fault here
                raise HttpToolFault(f"HTTP tool: --http_tool_token_file: {e}") from None
            self.client.headers["Authorization"] = f"Bearer {token}"
        self.token_file = None

    def call_batch(self, batch: Sequence[Mapping[str, Any]]) -> list[str | BaseException]:
        self._read_token()
        if len(batch) == 1:
            return [self._one(batch[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix=f"rlrun-{self.name}")
        return list(self._pool.map(self._one, batch))

    def _one(self, args: Mapping[str, Any]) -> str | BaseException:
        try:
            body = fill(self.body, args)
            resp = self.client.post(self.url, body)
        except ToolError as e:
            return e
        except ServiceError as e:
            if e.exhausted or (e.status is not None and e.status not in (401, 403)):
                return ToolError(str(e))
            raise  # a refused token, TLS: the job's fault
        try:
            answer = resp.json()
        except ValueError:
            if self.result_key:
                return ToolError(f"the answer is not JSON: {resp.text[:200]!r}")
            return resp.text
        try:
            return pick(answer, self.result_key)
        except ToolError as e:
            return e

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
