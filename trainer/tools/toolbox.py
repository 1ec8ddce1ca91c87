"""The dispatcher between the turn loop (:mod:`trainer.rollout.multiturn`) and the tools: which call a turn ends
with, whether the sample may still make it, the calls of a batch run per tool under the rules of
:mod:`trainer.tools.base` (errors and timeouts become result text), the results rendered and tokenized with
the per-call cap."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from trainer.deadlines import Fault
from trainer.tools.base import Call, Tool
from trainer.tools.formats import JsonFormat, TagFormat

log = logging.getLogger(__name__)

#: What the model reads after a result cut at --tool_max_result_tokens.
TRUNCATED = "\n...[truncated]"


@dataclass
class Result:
    """One call's outcome: the text the model reads, and whether it is an error (or a timeout)."""

    text: str
    error: bool = False
    timed_out: bool = False


@dataclass
class ToolStats:
    """Per tool, over a rollout: calls, errors (timeouts included), timeouts, seconds in the tool."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    samples: set[int] = field(default_factory=set)  # samples that called it


def error_text(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"error: {text[:500]}"


class Toolbox:
    """The job's tools, its call format and its caps (see :mod:`trainer.tools.base`)."""

    def __init__(self, tools: Sequence[Tool], fmt: TagFormat | JsonFormat, *, max_calls: int,
                 tool_max_calls: Mapping[str, int] | None = None, max_result_tokens: int | None = None,
                 max_sample_tokens: int | None = None, rejoin_steps: int = 0) -> None:
        if not tools:
            raise ValueError("a toolbox needs at least one tool")
        self.tools = {t.name: t for t in tools}
        self.format = fmt
        self.max_calls = max_calls
        self.tool_max_calls = dict(tool_max_calls or {})
        self.max_result_tokens = max_result_tokens
        self.max_sample_tokens = max_sample_tokens
        # engine steps a sample back from a tool may wait for the next request's, to rejoin the batch together
        # (trainer.rollout.multiturn.run_tool_rollout_streaming; --tool_rejoin_steps)
        self.rejoin_steps = rejoin_steps
        self.errors_seen = 0  # the first few errors' texts are logged (the job's log), then every 1000th

    @property
    def stops(self) -> tuple[str, ...]:
        return self.format.stops

    def parse(self, turn_text: str) -> Call | None:
        return self.format.parse(turn_text)

    def may_call(self, call: Call, calls_by_tool: Mapping[str, int], calls: int, inserted: int) -> bool:
        """Whether a sample that made ``calls`` calls (``calls_by_tool`` per tool) and has ``inserted`` tool
        tokens may make ``call``: under --max_turns, the tool's --tool_max_calls, --tool_max_sample_tokens."""
        if calls >= self.max_calls:
            return False
        if self.max_sample_tokens is not None and inserted >= self.max_sample_tokens:
            return False
        limit = self.tool_max_calls.get(call.tool)
        return limit is None or calls_by_tool.get(call.tool, 0) < limit

    # --- running calls ----------------------------------------------------------------------------------
    def run(self, calls: Sequence[Call], stats: dict[str, ToolStats] | None = None,
            rows: Sequence[int] | None = None) -> list[Result]:
        """One :class:`Result` per call, in order: the calls grouped per tool, each group in one
        ``call_batch`` (or one guarded ``call_one`` each). Only a :class:`Fault` is raised."""
        results: list[Result | None] = [None] * len(calls)
        groups: dict[str, list[int]] = {}
        for i, call in enumerate(calls):
            if call.error is not None:
                results[i] = Result(f"error: {call.error}", error=True)
            else:
                groups.setdefault(call.tool, []).append(i)
        for name, idx in groups.items():
            tool = self.tools[name]
            t0 = time.perf_counter()
            outs = self._call(tool, [calls[i].args for i in idx])
            st = stats.setdefault(name, ToolStats()) if stats is not None else None
            for i, out in zip(idx, outs, strict=True):
                results[i] = out
                if st is not None:
                    st.calls += 1
                    st.errors += out.error
                    st.timeouts += out.timed_out
                    if rows is not None:
                        st.samples.add(rows[i])
            if st is not None:
                st.seconds += time.perf_counter() - t0
        for call, result in zip(calls, results, strict=True):
            if result is not None and result.error:
                self.errors_seen += 1
                if self.errors_seen <= 3 or self.errors_seen % 1000 == 0:
                    log.warning("tool %s: error #%d: %s (the model reads it as the result)", call.tool or "?",
                                self.errors_seen, " ".join(result.text.split())[:300])
        for i, call in enumerate(calls):  # the calls that could not be read count as errors of their tool
            if call.error is not None and stats is not None:
                st = stats.setdefault(call.tool or "invalid", ToolStats())
                st.calls += 1
                st.errors += 1
                if rows is not None:
                    st.samples.add(rows[i])
        return [r for r in results if r is not None]

    def _call(self, tool: Tool, batch: list[Mapping]) -> list[Result]:
        if tool.batches():
            try:
                outs = tool.call_batch(batch)
            except Fault:
                raise
            except Exception as e:  # noqa: BLE001 - the whole batch failed: every call reads why
                return [Result(error_text(e), error=True) for _ in batch]
            if len(outs) != len(batch):
                raise RuntimeError(f"tool {tool.name!r} answered {len(outs)} results for {len(batch)} calls")
            return [_result(o) for o in outs]
        return self._guarded(tool, batch)

    @staticmethod
    def _guarded(tool: Tool, batch: list[Mapping]) -> list[Result]:
        """``tool.call_one`` for each call, each in a thread of its own, abandoned ``tool.timeout`` seconds after
        it started (a thread cannot be killed: an overrunning call is left to finish, its result dropped)."""
        boxes: list[dict] = [{} for _ in batch]

        def one(args: Mapping, box: dict) -> None:
            try:
                box["out"] = tool.call_one(args)
            except BaseException as e:  # noqa: BLE001 - carried to the caller's thread
                box["out"] = e

        threads = []
        for args, box in zip(batch, boxes, strict=True):
            thread = threading.Thread(target=one, args=(args, box), daemon=True, name=f"rlrun-tool-{tool.name}")
            thread.start()
            threads.append((thread, time.monotonic()))
        results = []
        for (thread, started), box in zip(threads, boxes, strict=True):
            thread.join(None if tool.timeout is None else max(0.0, started + tool.timeout - time.monotonic()))
            if thread.is_alive():
                results.append(Result(f"error: {tool.name} timed out after {tool.timeout:g} s", error=True,
                                      timed_out=True))
            else:
                results.append(_result(box["out"]))
        return results

    # --- what goes into the sequence --------------------------------------------------------------------
    def block_ids(self, call: Call, result: Result, tokenize: Callable[[str], list[int]]) -> list[int]:
        """The tokens inserted for ``result``: wrapped by the format, the result text cut to
        --tool_max_result_tokens (the cut marked). Uncut, the wrapped text is tokenized whole."""
        head, tail = self.format.wrap(call)
        if self.max_result_tokens is None:
            return tokenize(head + result.text + tail)
        body = tokenize(result.text)
        if len(body) <= self.max_result_tokens:
            return tokenize(head + result.text + tail)
        return tokenize(head) + body[: self.max_result_tokens] + tokenize(TRUNCATED + tail)

    def close(self) -> None:
        for tool in self.tools.values():
            tool.close()


def _result(out: str | BaseException) -> Result:
    if isinstance(out, Fault):
        raise out
    if isinstance(out, BaseException):
        return Result(error_text(out), error=True, timed_out=isinstance(out, TimeoutError))
    if isinstance(out, Result):
        return out
    return Result(str(out))
