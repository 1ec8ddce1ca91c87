"""trainer.tools: the call formats (tags, JSON), the dispatcher's rules (an error or a timeout is the model's text,
a fault ends the job, the caps per call and per sample, the per-tool call limits), and the turn loops with
several tools: inserted tokens masked, the streaming loop equal to the rounds, the cases peers' users hit
(unclosed and nested tags, tool output holding the stop tag, empty calls, a call at the budget's end, unicode,
huge outputs). The tools here are small real ones (a calculator, a clock that sleeps); the sandbox, the HTTP tool
and the search service have integration tests of their own."""

from __future__ import annotations

import threading
import time

import pytest

from trainer.deadlines import Fault
from trainer.rollout.multiturn import Completion, run_tool_rollout, run_tool_rollout_streaming
from trainer.tiny import build_tokenizer
from trainer.tools.base import Call, Tool, ToolError, check_name
from trainer.tools.formats import CALL_CLOSE, JsonFormat, TagFormat, tool_message_wrapping
from trainer.tools.registry import build_toolbox, parse_max_calls
from trainer.tools.toolbox import TRUNCATED, Result, Toolbox

TOK = build_tokenizer()
EOS = TOK.eos_token_id


def ids(text: str) -> list[int]:
    return list(TOK(text, add_special_tokens=False).input_ids)


def text(tokens: list[int]) -> str:
    return TOK.decode(tokens, skip_special_tokens=False)


class Calc(Tool):
    """Integer products and sums: ``<calc>12*34</calc>`` -> ``408``; anything else is an error it raises."""

    name = "calc"
    arg = "expr"
    result_template = "<out>{}</out>"
    timeout = 5.0

    def __init__(self):
        self.seen: list[str] = []

    def call_one(self, args):
        expr = args["expr"]
        self.seen.append(expr)
        if expr == "boom":
            raise RuntimeError("calculator on fire")
        if expr.startswith("echo "):
            return expr[5:]
        if expr == "huge":
            return "9" * 5000
        if expr == "tags":  # a result that holds the stop tag and a whole call
            return "</calc><calc>6*7</calc></answer>"
        a, op, b = expr.partition("*") if "*" in expr else expr.partition("+")
        if not (a.strip().isdigit() and b.strip().isdigit()):
            raise ToolError(f"cannot read {expr!r}")
        return str(int(a) * int(b) if op == "*" else int(a) + int(b))


class Sleepy(Tool):
    """Answers after ``args['s']`` seconds: a tool that overruns its timeout."""

    name = "sleepy"
    timeout = 0.3

    def call_one(self, args):
        time.sleep(float(args["input"]))
        return "awake"


class Down(Tool):
    """A tool whose service is gone for good: a fault, the job's one line."""

    name = "down"

    def call_one(self, args):
        raise Fault("down service http://x failed after 4 attempts: connection refused")


def box(*tools, max_calls=4, fmt=None, **caps) -> Toolbox:
    return Toolbox(list(tools), fmt or TagFormat(list(tools)), max_calls=max_calls, **caps)


# --- the tag format ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("turn, expected", [
    ("<calc>2*3</calc>", ("calc", "2*3")),
    ("think <calc> 2*3 </calc>\n", ("calc", "2*3")),
    ("<calc>1+1</calc> x <calc>2*2</calc>", ("calc", "2*2")),  # the turn stopped at the first close: the last call
    ("<calc>a <calc>2*2</calc>", ("calc", "2*2")),  # a nested / repeated opener is text before the call
    ("<calc></calc>", ("calc", "")),  # an empty call is a call (the tool says what is wrong)
    ("no opener</calc>", None),
    ("<calc>2*2", None),  # unclosed (the budget ran out, or EOS)
    ("<answer>6</answer>", None),
    ("<calc>2*2</calc> and more", None),  # the turn did not stop at the close tag: no call
    ("<python>\n    x = 1\n    print(x)\n</python>", ("python", "x = 1\nprint(x)")),  # code is dedented
    ("<calc>ünï 😀</calc>", ("calc", "ünï 😀")),
])  # fmt: skip
def test_tag_format_finds_the_call_a_turn_ends_with(turn, expected) -> None:
    from trainer.tools.python import Python
    from trainer.tools.sandbox import SandboxLimits

    fmt = TagFormat([Calc(), Python(SandboxLimits())])
    call = fmt.parse(turn)
    assert (None if call is None else (call.tool, next(iter(call.args.values())))) == expected
    assert fmt.stops == ("</calc>", "</python>", "</answer>")


def test_tag_format_wraps_results_in_the_tools_template() -> None:
    fmt = TagFormat([Calc()])
    assert fmt.wrap(Call("calc", {"expr": "1"})) == ("<out>", "</out>")


# --- the JSON format ----------------------------------------------------------------------------------------
def test_json_format_parses_hermes_calls_and_says_what_is_wrong() -> None:
    fmt = JsonFormat([Calc()], TOK)
    ok = fmt.parse('<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call>')
    assert ok == Call("calc", {"expr": "2*3"})
    as_string = fmt.parse('x <tool_call>{"name": "calc", "arguments": "{\\"expr\\": \\"4*5\\"}"}</tool_call>')
    assert as_string == Call("calc", {"expr": "4*5"})
    assert "not valid JSON" in fmt.parse("<tool_call>{name: calc}</tool_call>").error
    assert "unknown tool 'search'" in fmt.parse('<tool_call>{"name": "search", "arguments": {}}</tool_call>').error
    assert 'no "name"' in fmt.parse('<tool_call>{"arguments": {}}</tool_call>').error
    assert "must be an object" in fmt.parse('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>').error
    assert fmt.parse('<tool_call>{"name": "calc"}') is None  # unclosed
    assert fmt.stops == (CALL_CLOSE, "</answer>")


def test_json_format_writes_results_as_the_chat_template_renders_a_tool_message() -> None:
    head, tail = tool_message_wrapping(TOK)  # the tiny chatml template
    assert (head, tail) == ("<|im_end|>\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n")
    # what the template renders for the whole conversation is the turn, then head + result + tail
    turn = '<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call>'
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": turn}, {"role": "tool", "content": "6"}]
    rendered = TOK.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith(turn + head + "6" + tail)

    class NoTools:
        def apply_chat_template(self, chat, tokenize=False, add_generation_prompt=False):
            return "".join(m["content"] for m in chat if m["role"] != "tool")

    with pytest.raises(ValueError, match="does not render a 'tool' message"):
        tool_message_wrapping(NoTools())


# --- the dispatcher's rules -----------------------------------------------------------------------------------
def test_errors_reach_the_model_as_text_and_only_a_fault_ends_the_step() -> None:
    calc = Calc()
    b = box(calc, Sleepy())
    stats = {}
    t0 = time.monotonic()
    results = b.run([Call("calc", {"expr": "6*7"}), Call("calc", {"expr": "boom"}), Call("calc", {"expr": "x"}),
                     Call("sleepy", {"input": "3"}), Call("", error="the tool call is not valid JSON")], stats, [0, 1, 2, 3, 4])
    assert time.monotonic() - t0 < 2.0  # the sleeper was abandoned at its 0.3 s timeout
    assert [r.text for r in results] == ["42", "error: calculator on fire", "error: cannot read 'x'",
                                         "error: sleepy timed out after 0.3 s", "error: the tool call is not valid JSON"]
    assert [r.error for r in results] == [False, True, True, True, True]
    assert (stats["calc"].calls, stats["calc"].errors, stats["sleepy"].timeouts) == (3, 2, 1)
    with pytest.raises(Fault, match="failed after 4 attempts"):
        box(Down()).run([Call("down", {"input": "x"})])


def test_results_are_cut_per_call_and_marked() -> None:
    b = box(Calc(), max_result_tokens=5)
    long = b.block_ids(Call("calc"), Result("0123456789"), ids)
    assert text(long) == "<out>01234" + TRUNCATED + "</out>"
    short = b.block_ids(Call("calc"), Result("012"), ids)
    assert short == ids("<out>012</out>")  # under the cap: the wrapped text tokenized whole
    assert box(Calc()).block_ids(Call("calc"), Result("0123456789"), ids) == ids("<out>0123456789</out>")


def test_call_limits_per_sample_per_tool_and_inserted_tokens() -> None:
    b = box(Calc(), Sleepy(), max_calls=3, tool_max_calls={"calc": 1}, max_sample_tokens=50)
    calc, sleepy = Call("calc", {}), Call("sleepy", {})
    assert b.may_call(calc, {}, 0, 0)
    assert not b.may_call(calc, {"calc": 1}, 1, 10)  # calc's own limit
    assert b.may_call(sleepy, {"calc": 1}, 1, 10)
    assert not b.may_call(sleepy, {"sleepy": 3}, 3, 10)  # --max_turns: all tools together
    assert not b.may_call(sleepy, {}, 1, 50)  # the sample's inserted tokens are used up
    assert parse_max_calls(("python=4", " calc = 2")) == {"python": 4, "calc": 2}


def test_the_rejoin_wait_comes_from_the_jobs_flag() -> None:
    from trainer.config import TrainerConfig
    from trainer.config.schema import DEFAULT_REJOIN_STEPS
    from trainer.tools.registry import search_settings, settings

    cfg = TrainerConfig(pretrain="/m", prompt_data="/d", reward_fn="exact_match", tools=("python",),
                        tool_rejoin_steps=DEFAULT_REJOIN_STEPS + 3)
    assert build_toolbox(settings(cfg)).rejoin_steps == DEFAULT_REJOIN_STEPS + 3
    # Search-R1's flags alone (and a plug-in's settings without the flag): the job's default
    assert build_toolbox(search_settings("http://127.0.0.1:1/")).rejoin_steps == DEFAULT_REJOIN_STEPS


def test_tool_names_are_tags() -> None:
    assert check_name("python") is None and check_name("my_api2") is None
    assert "expected letters" in check_name("a-b") and "expected letters" in check_name("2x")


def test_a_plug_in_is_loaded_by_its_factory(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_tools.py").write_text(
        "from tests.unit.test_tools import Calc\n\ndef make(settings):\n    return Calc()\n\n"
        "def broken(settings):\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    b = build_toolbox({"tools": ("my_tools:make",), "max_turns": 2})
    assert list(b.tools) == ["calc"] and b.stops == ("</calc>", "</answer>")
    with pytest.raises(ValueError, match="not a trainer.tools.Tool"):
        build_toolbox({"tools": ("my_tools:broken",), "max_turns": 2})
    with pytest.raises(ValueError, match="cannot load the plug-in"):
        build_toolbox({"tools": ("my_tools:absent",), "max_turns": 2})


# --- the turn loops with tools --------------------------------------------------------------------------------
class Script:
    """An engine whose turns are scripted per sample (prompt ``Q<k>``): each call hands every context its next
    turn, cut to its budget; ``<eos>`` at a turn's end is the EOS token."""

    def __init__(self, turns: dict[int, list[str]], stops):
        self.turns = {k: list(v) for k, v in turns.items()}
        self.stops = tuple(stops)
        self.contexts: list[list[int]] = []

    def __call__(self, contexts, max_tokens, stop, temperature, top_p, seeds):
        assert tuple(stop) == self.stops
        out = []
        for ctx, budget in zip(contexts, max_tokens, strict=True):
            self.contexts.append(ctx)
            sample = next(k for k in self.turns if ids(f"Q{k}") == ctx[:len(ids(f"Q{k}"))])
            turn = self.turns[sample].pop(0)
            tokens = ids(turn.replace("<eos>", "")) + ([EOS] if turn.endswith("<eos>") else [])
            finish = "stop"
            if len(tokens) > budget:
                tokens, finish = tokens[:budget], "length"
            out.append(Completion(tokens, text(tokens), finish))
        return out


class Stepper:
    """The same scripts as a continuous-batching engine: one token per step."""

    def __init__(self, script: Script):
        self.script, self.live, self.aborted = script, {}, False

    def submit(self, key, context, max_tokens, stop, temperature, top_p, seed):
        (out,) = self.script([context], [max_tokens], stop, temperature, top_p, [seed])
        self.live[key] = (list(out.token_ids), out.finish_reason, [])

    def step(self):
        ended = []
        for key, (todo, finish, done) in list(self.live.items()):
            if todo:
                done.append(todo.pop(0))
            if not todo:
                del self.live[key]
                ended.append((key, Completion(done, text(done), finish)))
        return ended

    def pending(self):
        return len(self.live)

    def abort(self):
        self.aborted = True
        self.live.clear()


def roll(turns, toolbox, max_new_tokens=200, streaming=False):
    script = Script(turns, toolbox.stops)
    prompts = [ids(f"Q{k}") for k in turns]
    kwargs = dict(n=1, tool=toolbox, max_turns=toolbox.max_calls, max_new_tokens=max_new_tokens, temperature=1.0,
                  top_p=1.0, seed=3, eos_id=EOS)
    if streaming:
        return run_tool_rollout_streaming(Stepper(script), ids, prompts, **kwargs)
    return run_tool_rollout(script, ids, prompts, **kwargs)


def test_results_are_inserted_masked_and_errors_do_not_end_the_sample() -> None:
    calc = Calc()
    rows, stats = roll({1: ["<calc>12*34</calc>", "<answer>408</answer>"],
                        2: ["<calc>boom</calc>", "<calc>2+2</calc>", "<answer>4</answer><eos>"]}, box(calc))
    first, second = rows
    block = ids("<out>408</out>")
    assert first.response == ids("<calc>12*34</calc>") + block + ids("<answer>408</answer>")
    assert first.action_mask == [1] * 18 + [0] * len(block) + [1] * 20
    assert text(second.response).startswith("<calc>boom</calc><out>error: calculator on fire</out><calc>2+2</calc>")
    assert (second.tool_calls, second.turns, second.calls_by_tool) == (2, 3, {"calc": 2})
    assert second.inserted == second.action_mask.count(0) == len(ids("<out>error: calculator on fire</out><out>4</out>"))
    assert stats.by_tool["calc"].calls == 3 and stats.by_tool["calc"].errors == 1
    assert stats.as_dict()["tool/calc/errors"] == 1.0 and stats.inserted_tokens == first.inserted + second.inserted


def test_tool_output_holding_the_stop_tag_is_read_not_obeyed() -> None:
    """A result that contains ``</calc>`` or a whole call is inserted text: it is neither a stop nor a call;
    the next turn is parsed from what the model generated."""
    calc = Calc()
    rows, _ = roll({1: ["<calc>tags</calc>", "<answer>1</answer>"]}, box(calc))
    (row,) = rows
    assert row.tool_calls == 1 and row.turns == 2 and calc.seen == ["tags"]
    assert text(row.response) == "<calc>tags</calc><out></calc><calc>6*7</calc></answer></out><answer>1</answer>"


def test_a_call_at_the_budgets_end_and_huge_results() -> None:
    # the call closes on the last token of the budget: nothing left to insert, the sample is done, no call made
    calc = Calc()
    rows, _ = roll({1: ["<calc>2*2</calc>"]}, box(calc), max_new_tokens=len(ids("<calc>2*2</calc>")))
    assert rows[0].done and rows[0].tool_calls == 0 and calc.seen == []
    # a huge result: cut to the per-call cap, then to the sample's cap, then to the budget; masked all along
    rows, _ = roll({1: ["<calc>huge</calc>", "<calc>huge</calc>", "<answer>1</answer>"]},
                   box(Calc(), max_result_tokens=100, max_sample_tokens=150), max_new_tokens=1000)
    (row,) = rows
    per_call = len(ids("<out>")) + 100 + len(ids(TRUNCATED + "</out>"))
    assert row.inserted == 150 == per_call + (150 - per_call)  # the second result cut to the sample's cap
    assert row.tool_calls == 2 and text(row.response).endswith("<answer>1</answer>")
    rows, _ = roll({1: ["<calc>huge</calc>"]}, box(Calc()), max_new_tokens=300)
    assert len(rows[0].response) == 300 and rows[0].finish_reason == "length" and rows[0].action_mask[-1] == 0


def test_per_tool_limits_in_the_loop_and_unicode_results() -> None:
    b = box(Calc(), Sleepy(), max_calls=3, tool_max_calls={"calc": 1})
    rows, _ = roll({1: ["<calc>1+1</calc>", "<calc>2+2</calc>", "<answer>z</answer>"],
                    2: ["<calc>1+1</calc>", "<sleepy>0</sleepy>", "<answer>z</answer>"]}, b)
    assert rows[0].tool_calls == 1 and rows[0].done and text(rows[0].response).endswith("<calc>2+2</calc>")
    assert rows[1].calls_by_tool == {"calc": 1, "sleepy": 1} and text(rows[1].response).endswith("<answer>z</answer>")
    (result,) = b.run([Call("calc", {"expr": "echo ünï 😀 \u0000"})])
    assert result.text == "ünï 😀 \u0000" and not result.error  # the tokenizer decides what it can encode


MIXED = {1: ["<calc>12*34</calc>", "<answer>408</answer>"], 2: ["<answer>x</answer>"],
         3: ["<calc>boom</calc>", "<sleepy>0.01</sleepy>", "<calc>1+2</calc>", "<answer>3</answer>"],
         4: ["a long turn first, then <calc>3*3</calc>", "<answer>9</answer>"], 5: ["thinking<eos>"]}


@pytest.mark.parametrize("budget", [200, 45])
def test_streaming_gives_the_same_samples_as_rounds_with_several_tools(budget) -> None:
    def key(rows):
        return [(r.response, r.action_mask, r.turns, r.tool_calls, r.calls_by_tool, r.finish_reason) for r in rows]

    rounds, rstats = roll(MIXED, box(Calc(), Sleepy(), max_calls=3), max_new_tokens=budget)
    streamed, sstats = roll(MIXED, box(Calc(), Sleepy(), max_calls=3), max_new_tokens=budget, streaming=True)
    assert key(streamed) == key(rounds)
    assert {k: (v.calls, v.errors) for k, v in sstats.by_tool.items()} == {
        k: (v.calls, v.errors) for k, v in rstats.by_tool.items()}


def test_the_json_format_in_the_loop() -> None:
    calc = Calc()
    b = box(calc, fmt=JsonFormat([calc], TOK))
    call = '<tool_call>{"name": "calc", "arguments": {"expr": "6*7"}}</tool_call>'
    bad = '<tool_call>{"name": "calc", "arguments": {"expr": </tool_call>'
    rows, stats = roll({1: [call, "<answer>42</answer>"], 2: [bad, "<answer>?</answer>"]}, b)
    head, tail = tool_message_wrapping(TOK)
    assert text(rows[0].response) == call + head + "42" + tail + "<answer>42</answer>"
    assert rows[0].action_mask.count(0) == len(ids(head + "42" + tail))
    assert "error: the tool call is not valid JSON" in text(rows[1].response)
    assert stats.by_tool["invalid"].errors == 1 and stats.by_tool["calc"].errors == 0


def test_a_fault_in_the_streaming_loop_aborts_the_engine() -> None:
    b = box(Down())
    script = Script({1: ["<down>x</down>"], 2: ["y" * 50]}, b.stops)
    stepper = Stepper(script)
    with pytest.raises(Fault):
        run_tool_rollout_streaming(stepper, ids, [ids("Q1"), ids("Q2")], n=1, tool=b, max_turns=1,
                                   max_new_tokens=100, temperature=1.0, top_p=1.0, seed=1, eos_id=EOS)
    assert stepper.aborted and stepper.pending() == 0


def test_a_slow_tool_call_does_not_hold_the_other_samples() -> None:
    """The streaming loop: while one sample's call runs, the others keep decoding."""
    started = threading.Event()

    class Slow(Calc):
        name = "slow"

        def call_one(self, args):
            started.set()
            time.sleep(0.2)
            return "ok"

    b = box(Slow())
    rows, _ = roll({1: ["<slow>a</slow>", "<answer>a</answer>"], 2: ["z" * 30]}, b, streaming=True)
    assert started.is_set() and text(rows[1].response) == "z" * 30


def test_the_json_format_puts_the_tools_schemas_in_the_prompts(tmp_path) -> None:
    """--tool_format json: the chat template gets tools= (Hermes / Qwen templates write them in the system
    prompt); the tag format's prompts are as before."""
    import json

    from trainer.config import TrainerConfig
    from trainer.data import prompts_from_config

    tok = build_tokenizer()
    tok.chat_template = "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}" + tok.chat_template
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"q": [{"role": "user", "content": "what is 2*3?"}], "a": "6"}) + "\n")
    common = dict(pretrain="-", prompt_data=str(data), input_key="q", label_key="a", apply_chat_template=True,
                  reward_fn="exact_match", tools=("python",), max_samples=1, rollout_batch_size=1, train_batch_size=1,
                  micro_train_batch_size=1, micro_rollout_batch_size=1, actor_num_gpus_per_node=1,
                  advantage_estimator="group_norm", n_samples_per_prompt=2, init_kl_coef=0)
    (json_prompt,), _ = prompts_from_config(TrainerConfig(**common, tool_format="json"), tok)
    schema = json.loads(json_prompt.text.split("\n", 1)[0].removeprefix("TOOLS "))
    assert schema == [{"type": "function", "function": {"name": "python", "description": schema[0]["function"]["description"],
                       "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
    (tag_prompt,), _ = prompts_from_config(TrainerConfig(**common), tok)
    assert not tag_prompt.text.startswith("TOOLS") and tag_prompt.text == json_prompt.text.split("\n", 1)[1]
