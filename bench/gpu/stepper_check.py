"""On a GPU machine (vLLM 0.26, the engine core in its own process): the multi-turn loop's continuous
batching (``VllmEngine.stepper``: ``LLMEngine.add_request`` / ``step`` / ``abort_request``) against
``VllmEngine.complete`` on the same engine, and a streaming tool rollout end to end.

Checks, each printed OK or FAILED (exit 1 on any failure):

1. the same four requests submitted together to the stepper give the same tokens, texts and finish
   reasons as ``complete`` (same batch, same kernels: bit-identical greedy decoding);
2. requests added while others decode end within their budgets, on their stop string or their budget;
3. an abort leaves the engine with nothing running, and it still generates;
4. ``run_tool_rollout_streaming`` over the stepper, with a tool that answers every query, on a model
   whose first turn is forced to search (the prompt ends inside a search tag): every sample gets its
   information block masked out and a second turn.

    python3 bench/gpu/stepper_check.py --model DIR     # a model made by python -m trainer.tiny model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    args = parser.parse_args()

    import vllm

    from trainer.rollout.multiturn import information_block, run_tool_rollout_streaming
    from trainer.rollout.vllm_engine import VllmEngine

    t0 = time.perf_counter()
    engine = VllmEngine(args.model, max_model_len=512, gpu_memory_utilization=0.3, seed=0,
                        enable_prefix_caching=True)
    print(f"vllm {vllm.__version__}, engine up in {time.perf_counter() - t0:.0f} s, on_cpu={engine.on_cpu}", flush=True)
    tok = engine.tokenizer
    prompts = ["hello world", "3+4=", "copy 4821=", "The quick brown fox"]
    contexts = [list(tok(p).input_ids) for p in prompts]
    budgets = [3, 16, 7, 12]
    failures = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'OK' if ok else 'FAILED'}: {name}{(' ' + detail) if detail and not ok else ''}", flush=True)

    plain = engine.complete(contexts, budgets, (), 0.0, 1.0, [None] * 4)
    stop = (plain[1].text[4:6],)
    want = engine.complete(contexts, budgets, stop, 0.0, 1.0, [None] * 4)
    stepper = engine.stepper()
    check("the engine has a stepper", stepper is not None)
    for k in range(4):
        stepper.submit(k, contexts[k], budgets[k], stop, 0.0, 1.0, None)
    got: dict = {}
    while stepper.pending():
        got.update(stepper.step())
    same = [(got[k].token_ids, got[k].text, got[k].finish_reason) for k in range(4)] == [
        (c.token_ids, c.text, c.finish_reason) for c in want]
    check("1. one batch: stepper == complete", same, f"{got} vs {want}")

    got, steps = {}, 0
    for k in (0, 1):
        stepper.submit(k, contexts[k], budgets[k], stop, 0.0, 1.0, None)
    while stepper.pending() or len(got) < 4:
        if steps == 2:
            for k in (2, 3):
                stepper.submit(k, contexts[k], budgets[k], stop, 0.0, 1.0, None)
        got.update(stepper.step())
        steps += 1
    ok = all(len(got[k].token_ids) <= budgets[k] and (
        (got[k].finish_reason == "stop" and stop[0] in got[k].text) or
        (got[k].finish_reason == "length" and len(got[k].token_ids) == budgets[k])
        or (got[k].finish_reason == "stop" and got[k].token_ids[-1] == tok.eos_token_id)) for k in range(4))
    check("2. added mid-flight: budgets and stops kept", ok, str(got))

    stepper.submit(0, contexts[0], 64, (), 0.0, 1.0, None)
    stepper.step()
    stepper.abort()
    idle = not engine.llm.llm_engine.has_unfinished_requests()
    again = engine.complete(contexts[:1], [4], (), 0.0, 1.0, [None])
    check("3. abort leaves nothing running, the engine still generates", idle and bool(again[0].token_ids))

    queries: list[list[str]] = []

    def tool(batch):
        queries.append(list(batch))
        return [[f'"{q}"\n{q} is 42'] for q in batch]

    forced = [list(tok(p + " <search>kov</search").input_ids) for p in prompts]  # the next token may close it
    rows, stats = run_tool_rollout_streaming(
        _ForceClose(stepper, tok), lambda t: list(tok(t, add_special_tokens=False).input_ids), forced, n=2,
        tool=tool, max_turns=1, max_new_tokens=96, temperature=1.0, top_p=1.0, seed=3, eos_id=tok.eos_token_id)
    block = list(tok(information_block(['"kov"\nkov is 42']), add_special_tokens=False).input_ids)
    ok = all(r.tool_calls == 1 and r.turns == 2 and r.action_mask.count(0) == len(block) for r in rows)
    check("4. streaming rollout: every sample searched once, its block masked, a second turn", ok and
          sum(len(b) for b in queries) == len(rows) and all(q == "kov" for b in queries for q in b),
          f"{[(r.tool_calls, r.turns, r.action_mask.count(0)) for r in rows]} {queries}")
    print(f"rollout stats: {stats.as_dict()}", flush=True)
    engine.shutdown()
    print("all checks passed" if not failures else f"{failures} check(s) FAILED", flush=True)
    return 1 if failures else 0


class _ForceClose:
    """The stepper, with each sample's first turn closed by the caller: the context already ends in
    ``<search>kov</search`` and the first turn is the one token ``>``, so every sample searches (a random
    model would not); later turns are the engine's own."""

    def __init__(self, stepper, tok) -> None:  # noqa: ANN001
        self.stepper, self.tok = stepper, tok
        self.first: dict[int, bool] = {}
        self.ready: list = []

    def submit(self, key, context, max_tokens, stop, temperature, top_p, seed) -> None:  # noqa: ANN001
        from trainer.rollout.multiturn import Completion

        if key not in self.first:
            self.first[key] = True
            gt = list(self.tok(">", add_special_tokens=False).input_ids)
            self.ready.append((key, Completion(gt, "<search>kov</search>", "stop")))
            return
        self.stepper.submit(key, context, max_tokens, stop, temperature, top_p, seed)

    def step(self):  # noqa: ANN201
        ready, self.ready = self.ready, []
        return ready + (self.stepper.step() if self.stepper.pending() else [])

    def pending(self) -> int:
        return len(self.ready) + self.stepper.pending()

    def abort(self) -> None:
        self.ready = []
        self.stepper.abort()


if __name__ == "__main__":
    raise SystemExit(main())
