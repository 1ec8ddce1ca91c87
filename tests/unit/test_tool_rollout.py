"""The multi-turn loops of trainer.rollout.multiturn on scripted engines: stops, batched tool calls, inserted
tokens masked, budgets, max_turns; the streaming loop (continuous batching: a sample goes to the tool and
back while the others decode) gives the same samples as the loop in rounds; and the loops' parts (query
parsing, Search-R1's passage format, {node_ip})."""

from __future__ import annotations

import threading
import time

import pytest

from trainer.rollout.multiturn import (
    STOPS,
    Completion,
    SearchTool,
    cut_at_stop,
    format_passages,
    information_block,
    resolve_node_url,
    run_tool_rollout,
    run_tool_rollout_streaming,
    search_query,
)
from trainer.tiny import build_tokenizer

TOK = build_tokenizer()
EOS = TOK.eos_token_id


def ids(text: str) -> list[int]:
    return list(TOK(text, add_special_tokens=False).input_ids)


def text(tokens: list[int]) -> str:
    return TOK.decode(tokens, skip_special_tokens=True)


class Script:
    """An engine whose turns are scripted per sample: each call hands every context its next turn (cut to
    the budget, as an engine would); records what it was asked."""

    def __init__(self, turns: dict[int, list[str]]):
        self.turns = {k: list(v) for k, v in turns.items()}
        self.calls: list[tuple[list[list[int]], list[int], list]] = []

    def __call__(self, contexts, max_tokens, stop, temperature, top_p, seeds):
        assert tuple(stop) == STOPS
        self.calls.append((contexts, max_tokens, seeds))
        out = []
        for ctx, budget in zip(contexts, max_tokens, strict=True):
            sample = next(k for k in self.turns if ids(f"Q{k}") == ctx[:len(ids(f"Q{k}"))])
            turn = self.turns[sample].pop(0)
            tokens = ids(turn.replace("<eos>", "")) + ([EOS] if turn.endswith("<eos>") else [])
            finish = "stop"
            if len(tokens) > budget:
                tokens, finish = tokens[:budget], "length"
            out.append(Completion(tokens, text(tokens), finish))
        return out


class Lookup:
    """The tool: records each batch of queries; the passage is the query reversed."""

    def __init__(self):
        self.batches: list[list[str]] = []

    def __call__(self, queries):
        self.batches.append(list(queries))
        return [[f'"{q}"\n{q[::-1]}'] for q in queries]


def _run(turns, prompts, max_turns=2, max_new_tokens=200, n=1):
    engine, tool = Script(turns), Lookup()
    rows, stats = run_tool_rollout(engine, ids, [ids(p) for p in prompts], n=n, tool=tool, max_turns=max_turns,
                                   max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=7, eos_id=EOS)
    return rows, stats, engine, tool


def test_search_then_answer_masks_the_information_block() -> None:
    rows, stats, engine, tool = _run({1: ["<search>ab</search>", "<answer>ba</answer>"], 2: ["<answer>x</answer>"]},
                                     ["Q1", "Q2"])
    first, second = rows
    info = ids(information_block(['"ab"\nba']))
    assert first.response == ids("<search>ab</search>") + info + ids("<answer>ba</answer>")
    assert first.action_mask == [1] * 19 + [0] * len(info) + [1] * 19
    assert (first.turns, first.tool_calls, first.done) == (2, 1, True)
    assert second.response == ids("<answer>x</answer>") and second.action_mask == [1] * len(second.response)
    assert (second.turns, second.tool_calls) == (1, 0)
    assert tool.batches == [["ab"]]
    # the second turn continues the whole context: prompt, first turn, information
    assert engine.calls[1][0] == [ids("Q1") + ids("<search>ab</search>") + info]
    assert stats.tool_calls == 1 and stats.samples == 2


def test_one_batched_tool_call_per_round_and_distinct_seeds() -> None:
    turns = {k: [f"<search>q{k}</search>", "<answer>a</answer>"] for k in range(4)}
    rows, _, engine, tool = _run(turns, [f"Q{k}" for k in range(4)])
    assert tool.batches == [["q0", "q1", "q2", "q3"]]  # one request for the whole batch
    assert len(engine.calls) == 2 and len(engine.calls[0][0]) == 4
    seeds = [s for call in engine.calls for s in call[2]]
    assert len(set(seeds)) == len(seeds)  # no two samples (or turns) share a sampling seed
    assert [r.tool_calls for r in rows] == [1, 1, 1, 1]


def test_max_turns_then_one_last_turn_to_answer() -> None:
    rows, _, engine, tool = _run({1: ["<search>a1</search>", "<search>a2</search>", "<search>a3</search>",
                                      "<answer>z</answer>"]}, ["Q1"], max_turns=2)
    (row,) = rows
    assert (row.tool_calls, row.turns) == (2, 3)  # the third search gets no information
    assert tool.batches == [["a1"], ["a2"]]
    assert text(row.response).endswith("<search>a3</search>")


def test_eos_or_no_search_ends_the_sample() -> None:
    rows, _, _, tool = _run({1: ["thinking<eos>"], 2: ["<search>x</search> more"], 3: ["x</search>"]},
                            ["Q1", "Q2", "Q3"])
    assert [r.turns for r in rows] == [1, 1, 1] and tool.batches == []
    assert rows[0].response[-1] == EOS


def test_budget_covers_inserted_tokens_and_cuts_the_information() -> None:
    rows, _, engine, _ = _run({1: ["<search>abcdef</search>", "<answer>x</answer>"]}, ["Q1"], max_new_tokens=40)
    (row,) = rows
    assert len(row.response) == 40 and row.finish_reason == "length" and row.done
    assert row.action_mask == [1] * 23 + [0] * 17  # the information block cut to what remained
    assert len(engine.calls) == 1  # no room left to answer: no second turn
    rows, _, engine, _ = _run({1: ["<search>ab</search>", "<answer>xyz</answer>"]}, ["Q1"], max_new_tokens=80)
    assert engine.calls[1][1] == [80 - 19 - len(ids(information_block(['"ab"\nba'])))]
    assert len(rows[0].response) == 80 and rows[0].finish_reason == "length"


def test_n_samples_per_prompt_are_prompt_major() -> None:
    turns = {1: ["<answer>a</answer>"] * 3, 2: ["<answer>b</answer>"] * 3}
    rows, _, _, _ = _run(turns, ["Q1", "Q2"], n=3)
    assert [r.prompt_index for r in rows] == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("turn, query", [
    ("<search>capital of france</search>", "capital of france"),
    ("think <search> a </search>\n", "a"),
    ("<search>old</search> x <search>new</search>", "new"),
    ("<search></search>", ""),
    ("no open</search>", None),
    ("<answer>a</answer>", None),
    ("<search>a</search> trailing", None),
])  # fmt: skip
def test_search_query(turn, query) -> None:
    assert search_query(turn) == query


def test_passages_in_search_r1_format() -> None:
    assert format_passages(['"Paris"\nParis is the capital.', "untitled"]) == (
        'Doc 1(Title: "Paris") Paris is the capital.\nDoc 2(Title: untitled) ')
    assert information_block(["t\nx"]) == "\n\n<information>Doc 1(Title: t) x</information>\n\n"


def test_cut_at_stop() -> None:
    tokens = ids("<search>a</search>bcd")
    assert cut_at_stop(tokens, text, STOPS) == ids("<search>a</search>")
    assert cut_at_stop(ids("abc"), text, STOPS) == ids("abc")
    assert cut_at_stop(ids("x</answer></search>"), text, STOPS) == ids("x</answer>")


def test_node_ip_is_this_nodes_address() -> None:
    assert resolve_node_url("http://{node_ip}:8000/retrieve", "10.0.0.7") == "http://10.0.0.7:8000/retrieve"
    assert resolve_node_url("http://{node_ip}:8000/retrieve", "fd00::2") == "http://[fd00::2]:8000/retrieve"
    assert resolve_node_url("http://h:1/retrieve") == "http://h:1/retrieve"
    assert resolve_node_url("http://{node_ip}:1/r") == "http://127.0.0.1:1/r"  # outside Ray


def test_search_tool_answers_empty_queries_without_a_request() -> None:
    tool = SearchTool("http://127.0.0.1:9/retrieve", 3)  # nothing listens there: a request would fail
    assert tool(["", "  "]) == [[], []]
    with pytest.raises(ValueError, match="topk must be >= 1"):
        SearchTool("http://x/retrieve", 0)


class Steps:
    """A continuous-batching engine over the same scripts as :class:`Script`: a submitted turn produces one
    token per :meth:`step` and ends at its last token (or its budget); records every event in order."""

    def __init__(self, turns: dict[int, list[str]], before_step=None):
        self.script = Script(turns)
        self.live: dict[int, tuple[list[int], str]] = {}  # key -> (tokens still to produce, finish)
        self.events: list[tuple] = []
        self.steps = 0
        self.aborted = False
        self.before_step = before_step

    def submit(self, key, context, max_tokens, stop, temperature, top_p, seed):
        (out,) = self.script([context], [max_tokens], stop, temperature, top_p, [seed])
        self.live[key] = (list(out.token_ids), out.finish_reason, [])
        self.events.append(("submit", key, self.steps))

    def step(self):
        if self.before_step:
            self.before_step(self)
        self.steps += 1
        ended = []
        for key, (todo, finish, done) in list(self.live.items()):
            if todo:
                done.append(todo.pop(0))
            if not todo:
                del self.live[key]
                ended.append((key, Completion(done, text(done), finish)))
                self.events.append(("end", key, self.steps))
        return ended

    def pending(self):
        return len(self.live)

    def abort(self):
        self.aborted = True
        self.live.clear()


def _stream(turns, prompts, max_turns=2, max_new_tokens=200, n=1, tool=None, stepper=None, rejoin_steps=None):
    stepper = stepper or Steps(turns)
    tool = tool or Lookup()
    rows, stats = run_tool_rollout_streaming(stepper, ids, [ids(p) for p in prompts], n=n, tool=tool,
                                             max_turns=max_turns, max_new_tokens=max_new_tokens, temperature=1.0,
                                             top_p=1.0, seed=7, eos_id=EOS, rejoin_steps=rejoin_steps)
    return rows, stats, stepper, tool


MIXED = {1: ["<search>ab</search>", "<answer>ba</answer>"], 2: ["<answer>x</answer>"],
         3: ["<search>q</search>", "<search>r</search>", "<search>s</search>", "<answer>z</answer>"],
         4: ["a long first turn that searches at the end <search>cd</search>", "<answer>dc</answer>"],
         5: ["<search>abcdefghij</search>", "<answer>x</answer>"], 6: ["thinking<eos>"]}


def test_streaming_gives_the_same_samples_as_rounds() -> None:
    prompts = [f"Q{k}" for k in MIXED]
    for budget in (200, 60):  # with room to answer, and with information blocks cut by the budget
        rounds, rstats, script, _ = _run(MIXED, prompts, max_new_tokens=budget)
        streamed, sstats, stepper, _ = _stream(MIXED, prompts, max_new_tokens=budget)
        key = [(r.prompt_index, r.response, r.action_mask, r.turns, r.tool_calls, r.finish_reason, r.done)
               for r in rounds]
        assert [(r.prompt_index, r.response, r.action_mask, r.turns, r.tool_calls, r.finish_reason, r.done)
                for r in streamed] == key
        assert sstats.tool_calls == rstats.tool_calls and sstats.samples == rstats.samples == len(MIXED)
        # the same per-sample, per-turn seeds as the rounds (so a seeded rollout samples the same tokens)
        assert sorted(s for call in stepper.script.calls for s in call[2]) == sorted(
            s for call in script.calls for s in call[2])


def test_streaming_has_no_turn_barrier() -> None:
    """Sample 1 searches at once; sample 2's first turn is long. Sample 1 goes to the tool and starts its
    second turn while sample 2 is still in its first (rounds would wait for sample 2)."""
    answered = threading.Event()

    class Tool(Lookup):
        def __call__(self, queries):
            try:
                return super().__call__(queries)
            finally:
                answered.set()

    def wait_for_the_tool(stepper):  # a slow engine step: the tool thread has answered before it ends
        if stepper.steps == 25:
            assert answered.wait(10)
            time.sleep(0.05)

    turns = {1: ["<search>ab</search>", "<answer>ba</answer>"], 2: ["x" * 60 + "<answer>y</answer>"]}
    rows, _, stepper, tool = _stream(turns, ["Q1", "Q2"], tool=Tool(), stepper=Steps(turns, wait_for_the_tool))
    second_turn = [t for e, k, t in stepper.events if e == "submit" and k == 0][1]
    first_end_of_2 = next(t for e, k, t in stepper.events if e == "end" and k == 1)
    assert second_turn < first_end_of_2, stepper.events
    assert stepper.steps == len(ids("x" * 60 + "<answer>y</answer>"))  # the longest sample, not a sum of turns
    assert tool.batches == [["ab"]] and rows[0].tool_calls == 1


def test_samples_that_end_their_turn_together_share_one_request() -> None:
    turns = {k: [f"<search>q{k}</search>", "<answer>a</answer>"] for k in range(4)}
    _, stats, _, tool = _stream(turns, [f"Q{k}" for k in range(4)])
    assert tool.batches == [["q0", "q1", "q2", "q3"]] and stats.tool_calls == 4


def _two_waves(rejoin_steps):
    """Sample 1 searches first; sample 2 ends its turn while sample 1's request is out, so it goes in a second
    request; sample 3 decodes throughout. The engine lets request "a" be answered in step ``at_a`` and "b" 6
    steps later, and waits in that step for the tool thread's answer (so the timing is the test's, not the
    machine's; on a loaded machine the loop may still see an answer one step late)."""
    first, second = "<search>a</search>", "xx<search>b</search>"
    at_a = len(ids(second)) + 2
    release = {"a": threading.Event(), "b": threading.Event()}
    answered = {"a": threading.Event(), "b": threading.Event()}

    class Tool(Lookup):
        def __call__(self, queries):
            (q,) = queries
            assert release[q].wait(10)
            try:
                return super().__call__(queries)
            finally:
                answered[q].set()

    def answer(stepper):
        for q, at in (("a", at_a), ("b", at_a + 6)):
            if stepper.steps == at:
                release[q].set()
                assert answered[q].wait(10)
                time.sleep(0.05)  # the future is done before the loop looks

    turns = {1: [first, "<answer>a</answer>"], 2: [second, "<answer>b</answer>"], 3: ["y" * 80 + "<eos>"]}
    rows, stats, stepper, tool = _stream(turns, ["Q1", "Q2", "Q3"], tool=Tool(), stepper=Steps(turns, answer),
                                         rejoin_steps=rejoin_steps)
    assert tool.batches == [["a"], ["b"]]
    again = {k: [t for e, key, t in stepper.events if e == "submit" and key == k][1] for k in (0, 1)}
    a = at_a + 1  # the step that answered "a" (the hook runs before a step is counted)
    return rows, stats, again, a, a + 6


def test_samples_back_from_a_tool_rejoin_with_the_next_request_when_they_may_wait() -> None:
    alone, alone_stats, again, a, b = _two_waves(rejoin_steps=0)
    # each as soon as its answer is in: two steps with a prefill (an answer may be seen one step late)
    assert again[0] in (a, a + 1) and again[1] in (b, b + 1), again
    assert alone_stats.joined_steps == 3  # the prompts, then each request's sample
    held, held_stats, again, a, b = _two_waves(rejoin_steps=10)
    assert again[0] == again[1] and again[1] in (b, b + 1), again  # sample 1 waited for sample 2's answer
    assert held_stats.joined_steps == 2
    key = [(r.response, r.action_mask, r.turns, r.tool_calls, r.finish_reason) for r in alone]
    assert [(r.response, r.action_mask, r.turns, r.tool_calls, r.finish_reason) for r in held] == key
    _, _, again, a, b = _two_waves(rejoin_steps=2)  # waits 2 steps at most: alone again, 2 steps late
    assert again[0] in (a + 2, a + 3) and again[1] in (b, b + 1), again
    with pytest.raises(ValueError, match="rejoin_steps must be >= 0"):
        _stream(MIXED, ["Q1"], rejoin_steps=-1)


def test_streaming_aborts_the_engine_on_a_fault_of_the_tool() -> None:
    """A fault (the retrieval service down past its outage deadline: the job's one line) ends the rollout and the
    engine drops what it was decoding; a tool's other errors are the model's to read (test_tools_rules)."""
    from trainer.retrieval.client import RetrievalError

    def broken(queries):
        raise RetrievalError("retrieval service down")

    turns = {1: ["<search>ab</search>", "<answer>ba</answer>"], 2: ["x" * 80]}
    stepper = Steps(turns)
    with pytest.raises(RetrievalError, match="service down"):
        _stream(turns, ["Q1", "Q2"], tool=broken, stepper=stepper)
    assert stepper.aborted and stepper.pending() == 0


def test_streaming_refuses_an_engine_that_drops_a_request() -> None:
    class Drops(Steps):
        def step(self):
            self.live.pop(1, None)  # sample 2's request vanishes
            return super().step()

    with pytest.raises(RuntimeError, match=r"no completion for samples \[1\]"):
        _stream({1: ["<answer>a</answer>"], 2: ["<answer>b</answer>"]}, ["Q1", "Q2"],
                stepper=Drops({1: ["<answer>a</answer>"], 2: ["<answer>b</answer>"]}))
