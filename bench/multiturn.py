"""Multi-turn rollout overhead at the tiny demos' size (issue 20's target: <= 15 % of generate time), with the
search tool (tiny-search) or the python tool (tiny-python).

What it measures, on this machine's CPUs (or one GPU), with vLLM in-process and the real tool (``--tool search``:
the retrieval service, ``python -m trainer.retrieval serve`` over the tiny-search corpus, loopback; ``--tool
python``: the sandbox, a fresh process per call):

- ``multi-turn``: ``VllmEngine.generate_with_tools`` (``trainer.rollout.multiturn`` over ``trainer.tools``) for the
  demo's batch (8 prompts x 8 samples, one call each), a model taught for a few seconds to call the tool so every
  sample calls it;
- ``baseline``: the same engine generating exactly as many tokens per sample as the policy generated in the
  multi-turn run, all samples in ONE call without tools (``ignore_eos``, fixed lengths), each seeded as the
  trainer's rollouts are, and with the sampled tokens' log-probs as both the trainer's rollouts ask for them
  (``--skip-logprobs``: neither side, as with --skip_rollout_logprobs; until 2026-11-27 the baseline alone went
  without, and the multi-turn side paid for the log-probs: most of the overhead measured on the CPU, 61 % of
  which 14.5 % remains);
- overhead = multi-turn / baseline - 1: the median over ``--repeats`` pairs, each pair back to back (on a
  shared 2-core machine single runs swing by tens of per cent; a pair sees the same machine).

Where the time goes (each as a share of the baseline's time, medians over the pairs): the tool calls (their own
time; in the streaming loop they overlap the decoding), tokenizing the results, the bookkeeping between turns,
and the prefill of the inserted tokens: a second baseline whose prompts hold each sample's inserted tokens
(``baseline + inserted``) costs that much more than the plain one. And the engine steps of each (a pass lasts
as many steps as its longest sample; the time per step says whether the extra time is more steps or dearer
ones) and the time the loop stood idle, every unfinished sample waiting on its tool. And where vLLM's front end
spent each side's pass (:class:`FrontEndProbe`): waiting on the core, adding requests, its own work. Python's
garbage is collected before every timed pass (a collection inside a ~0.35 s pass is noise of tens of per cent).

    python bench/multiturn.py [--tool search|python] [--repeats 11]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))
NEVER = "\uffff"  # a noncharacter: in no text the tokenizers here decode, so a stop string behind it never matches


def teach(model_dir: Path, prompts: list[str], targets: list[str], steps: int = 300, lr: float = 3e-3,
          gpu: bool = False) -> None:
    """A few seconds of supervised steps so the random-init model writes the call (a ``--model``, such as the 0.5B
    shape, on the GPU when there is one)."""
    import torch

    from trainer.tiny import teach as fit

    # The demos' tiny model is taught on the CPU wherever the bench runs (the same model as in the earlier
    # figures: taught on a GPU it called the tool in 47 % of the samples, not ~85 %); a larger one on the GPU.
    fit(model_dir, list(zip(prompts, targets, strict=True)), steps, lr=lr,
        device="cuda" if gpu and torch.cuda.is_available() else "cpu")


def task(tool: str, work: Path) -> tuple[list[dict], list[str]]:
    """The demo's questions and, per question, the call the model is taught to write."""
    import json

    from trainer.tiny import make_python_data, make_search_data

    if tool == "search":
        make_search_data(work / "data", n=64, distractors=64)
        questions = [json.loads(line) for line in (work / "data" / "questions.jsonl").read_text().splitlines()]
        names = [q["question"][0]["content"].rsplit(" ", 1)[1].rstrip("?") for q in questions]
        return questions, [f"<search>{n}</search>" for n in names]
    make_python_data(work / "data", n=64, warmup=0)
    questions = [json.loads(line) for line in (work / "data" / "questions.jsonl").read_text().splitlines()]
    factors = [q["question"][0]["content"].rsplit(" ", 1)[1].rstrip("?") for q in questions]
    return questions, [f"<python>print({f})</python>" for f in factors]


def main() -> int:
    from trainer.config import CUDAGRAPH_MODES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", choices=("search", "python"), default="search")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--gpu-util", type=float, default=0.3,
                        help="on a GPU: the engine's share of its memory (the demo's model needs little)")
    parser.add_argument("--model", help="a model directory to use instead of the demos' tiny model (copied, then "
                        "taught the call): bench/gpu/model.py's 0.5B shape, for one")
    parser.add_argument("--teach-lr", type=float, default=3e-3,
                        help="the call's supervised steps' learning rate (3e-4 suits the 0.5B shape)")
    parser.add_argument("--skip-logprobs", action="store_true",
                        help="both sides without the sampled tokens' log-probs (--skip_rollout_logprobs); by default "
                             "both ask for them, as the trainer's rollouts do")
    parser.add_argument("--capture", type=int, default=None,
                        help="on a GPU: the largest step (tokens) the engine captures a CUDA graph for (vLLM's "
                             "max_cudagraph_capture_size; its default: 512, or twice max_num_seqs when smaller)")
    parser.add_argument("--cudagraph-mode", choices=CUDAGRAPH_MODES, default=None,
                        help="on a GPU: which steps run as CUDA graphs (--vllm_cudagraph_mode; vLLM's default "
                             "full_and_piecewise runs a step with a prefill, where samples rejoin from the tool, "
                             "with its attention outside the graphs; full: whole graphs for those too)")
    parser.add_argument("--rejoin-steps", type=int, default=None,
                        help="engine steps a sample back from the tool may wait to rejoin with the next request's "
                             "(--tool_rejoin_steps; default: the job's default)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the check that the engine's log-probs match a plain transformers forward of the "
                             "same tokens (first turns and turns after a rejoin apart): what says a CUDA-graph mode "
                             "computes what the default does")
    parser.add_argument("--block-size", type=int, default=None,
                        help="the engine's KV block size (vLLM's default when left out; the prefix cache reuses "
                             "whole blocks only)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from trainer.config import TrainerConfig
    from trainer.retrieval.local import local_service
    from trainer.tiny import make_model
    from trainer.tools.registry import search_settings
    from trainer.tools.registry import settings as tool_settings

    work = Path(tempfile.mkdtemp(prefix="bench-multiturn-"))
    if args.model:
        shutil.copytree(args.model, work / "model")
    else:
        make_model(work / "model", hidden_size=128)  # the demos' model (presets tiny-search, tiny-python: model-h128)
    questions, calls = task(args.tool, work)
    tok = AutoTokenizer.from_pretrained(work / "model")
    prompts = [tok.apply_chat_template(q["question"], tokenize=False, add_generation_prompt=True) for q in questions]
    teach(work / "model", prompts, calls, lr=args.teach_lr, gpu=bool(args.model))
    try:
        with contextlib.ExitStack() as stack:
            if args.tool == "search":
                settings = search_settings(stack.enter_context(local_service(work / "data" / "corpus.jsonl", work)).url,
                                           topk=1, max_turns=1)
            else:  # the python tool with the job defaults (the preset's)
                settings = tool_settings(TrainerConfig(pretrain="-", prompt_data="-", reward_fn="exact_match",
                                                       tools=("python",)))
            if args.rejoin_steps is not None:
                settings["tool_rejoin_steps"] = args.rejoin_steps
            run_pairs(args, work, prompts, settings)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the model, data and index it made
    return 0


def run_pairs(args, work: Path, prompts: list[str], settings: dict) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from trainer.rollout.vllm_engine import VllmEngine

    extra = {} if args.block_size is None else {"block_size": args.block_size}
    if args.capture is not None:
        extra["compilation_config"] = {"max_cudagraph_capture_size": args.capture}
    engine = VllmEngine(str(work / "model"), enable_prefix_caching=True, max_model_len=192, seed=0,
                        gpu_memory_utilization=args.gpu_util, cudagraph_mode=args.cudagraph_mode, **extra)
    batch = prompts[:args.prompts]
    probe = FrontEndProbe(engine.llm.llm_engine)

    def baseline(samples, r: int, with_inserted: bool, stops: tuple[str, ...] = ()) -> tuple[float, dict]:
        engine.reset_prefix_cache()
        lengths = [max(sum(s.action_mask), 1) for s in samples]
        contexts = [s.prompt_token_ids + ([t for t, m in zip(s.response_token_ids, s.action_mask, strict=True) if m == 0]
                                          if with_inserted else []) for s in samples]
        # Seeded per request, as the trainer's single-turn rollout and the multi-turn one are (a seeded request is
        # sampled with its own generator: unseeded, the baseline would be faster for a reason that has nothing to
        # do with tools).
        # With the sampled tokens' log-probs when the multi-turn side has them, as the trainer's one-pass
        # rollout asks for them (unless --skip_rollout_logprobs): a vLLM step with them costs ~46 % more at this
        # size on the CPU build (2026-11-27), which is no cost of the tools.
        lp = None if args.skip_logprobs else 0
        # Exactly k tokens each: ignore_eos, and no stop string that can match. No min_tokens: vLLM masks the stop
        # tokens of such requests at every step (a cost the multi-turn side does not pay), and its front end
        # checks no stop string before min_tokens (until 2026-11-28 the stop strings' column measured nothing).
        # ``stops``: the turns' stop strings, each behind a character no tokenizer here produces (U+FFFF): the
        # front end checks them on every new token's text as it checks the turns', and none ever matches.
        params = [SamplingParams(temperature=1.0, max_tokens=k, ignore_eos=True, seed=r * 100_000 + i, logprobs=lp,
                                 stop=[NEVER + s for s in stops] or None, include_stop_str_in_output=bool(stops))
                  for i, k in enumerate(lengths)]
        outs, took, front = probe.timed(engine.llm.generate, [TokensPrompt(prompt_token_ids=c) for c in contexts],
                                        params, use_tqdm=False)
        got = [len(o.outputs[0].token_ids) for o in outs]
        if got != lengths:  # the one pass must generate exactly the multi-turn side's tokens, or the ratio is void
            raise RuntimeError(f"the one pass generated {got[:8]}... tokens, asked for {lengths[:8]}...")
        return took, front

    rows = []
    for r in range(args.repeats + 1):  # the first pair warms up (compilation, caches)
        engine.reset_prefix_cache()
        (samples, stats), t_mt, front = probe.timed(engine.generate_with_tools, batch, n=args.n, temperature=1.0,
                                                    max_new_tokens=128, seed=r, tools=settings,
                                                    logprobs=not args.skip_logprobs)
        t_base, base_front = baseline(samples, r, with_inserted=False)
        t_ins, _ = baseline(samples, r, with_inserted=True)
        stops = next(iter(engine.__dict__["_toolboxes"].values())).stops  # the toolbox generate_with_tools made
        t_stops, _ = baseline(samples, r, with_inserted=False, stops=tuple(stops))
        if r:
            rows.append({"mt": t_mt, "base": t_base, "ins": t_ins, "stops": t_stops, "tool": stats["tool_s"],
                         "core": front["core"], "outputs": front["outputs"], "adds": front["adds"],
                         "add": front["add"], "base_core": base_front["core"], "base_outputs": base_front["outputs"],
                         "tokenize": stats["tokenize_s"], "other": stats["other_s"], "idle": stats["idle_s"],
                         "gen": stats["generate_s"], "steps": stats["steps"], "base_steps": base_front["outputs"],
                         "joined_steps": stats["joined_steps"], "joined": stats["joined_s"],
                         "called": sum(s.tool_calls > 0 for s in samples) / len(samples),
                         "errors": sum(v for k, v in stats.items() if k.endswith("/errors"))})
    rejoin = next(iter(engine.__dict__["_toolboxes"].values())).rejoin_steps  # the toolbox the rollouts used
    dtype = engine.llm.llm_engine.vllm_config.model_config.dtype
    compiled = engine.llm.llm_engine.vllm_config.compilation_config
    graphs, mode = compiled.max_cudagraph_capture_size, compiled.cudagraph_mode.name.lower()
    engine.shutdown()
    print(f"tool {args.tool}: {args.prompts} prompts x {args.n} samples, one call each, "
          f"{'no' if args.skip_logprobs else 'with the'} sampled tokens' log-probs; {os.cpu_count()} CPUs visible, "
          f"load average {os.getloadavg()[0]:.1f}; CUDA graphs ({mode if not engine.on_cpu else '-'}) up to "
          f"{graphs if not engine.on_cpu else '-'} tokens; samples back from the tool wait up to "
          f"{rejoin} steps to rejoin together")
    report(args, rows)
    if not args.no_check and not args.skip_logprobs:
        check(work / "model", samples, dtype)


class FrontEndProbe:
    """Where vLLM's front end (the process that steps ``LLMEngine``: the bench's, as in the trainer's engine actor)
    spends a pass: ``core`` the seconds inside ``engine_core.get_output()`` (with the core in a process of its own,
    the GPU default: waiting for the core's next step's outputs; in-process, the CPU default: the core's step
    itself) over ``outputs`` calls, and ``add`` the seconds of ``LLMEngine.add_request`` over ``adds`` requests.
    Whatever else a pass takes is the front end's own work: its output processing (detokenizing, stop strings,
    log-probs) and, in the multi-turn loop, the turns' bookkeeping. A front end that waits little on a core of its
    own is the bottleneck: the core then waits for requests it would already have had."""

    def __init__(self, llm_engine) -> None:
        self.seconds = {"core": 0.0, "outputs": 0, "add": 0.0, "adds": 0}
        core, get_output, add_request = llm_engine.engine_core, llm_engine.engine_core.get_output, llm_engine.add_request

        def timed_output():
            t0 = time.perf_counter()
            try:
                return get_output()
            finally:
                self.seconds["core"] += time.perf_counter() - t0
                self.seconds["outputs"] += 1

        def timed_add(*a, **kw):
            t0 = time.perf_counter()
            try:
                return add_request(*a, **kw)
            finally:
                self.seconds["add"] += time.perf_counter() - t0
                self.seconds["adds"] += 1

        core.get_output = timed_output  # instance attributes over the methods, for the engine's life
        llm_engine.add_request = timed_add

    def timed(self, run, *args, **kwargs):
        """``run(*args, **kwargs)`` as one timed pass: Python's garbage collected first (a collection inside a
        ~0.35 s pass is noise of tens of per cent), the counters from zero; its result, its seconds and the
        counters. ``outputs`` is also the pass's engine steps: ``LLMEngine.step()`` takes one output of the core
        each (vLLM 0.26 and 0.32)."""
        self.seconds.update(core=0.0, outputs=0, add=0.0, adds=0)
        gc.collect()
        t0 = time.perf_counter()
        result = run(*args, **kwargs)
        return result, time.perf_counter() - t0, dict(self.seconds)


def check(model_dir: Path, samples, dtype) -> None:
    """The last rollout's log-probs, as the engine reported them, against a transformers forward of the same
    tokens in the engine's dtype (after the engine is gone): a step that computed attention wrongly (a CUDA graph
    replayed for a batch it does not fit, say) shows as a gap far above the dtype's floor, in the turns after a
    rejoin above all, where the context was prefilled beside others' decoding."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    gaps: dict[str, list[float]] = {"first turn": [], "after a rejoin": []}
    with torch.no_grad():
        for s in samples:
            ids = s.prompt_token_ids + s.response_token_ids
            logits = model(torch.tensor([ids], device=device)).logits[0].float()
            mine = torch.log_softmax(logits[len(s.prompt_token_ids) - 1:-1], dim=-1)
            theirs = mine.gather(1, torch.tensor(s.response_token_ids, device=device)[:, None])[:, 0].tolist()
            rejoined = False
            for m, a, b in zip(s.action_mask, s.logprobs, theirs, strict=True):
                if m == 0:  # a tool's token: the engine's turns after it were prefilled anew
                    rejoined = True
                else:  # a token the engine sampled
                    gaps["after a rejoin" if rejoined else "first turn"].append(abs(a - b))
    parts = [f"{k} {statistics.mean(v):.4f} mean, {max(v):.4f} max ({len(v)} tokens)" if v else f"{k}: none"
             for k, v in gaps.items()]
    print(f"log-probs, the engine's against transformers' ({dtype}, {device}): " + "; ".join(parts))


def report(args, rows: list[dict]) -> None:
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    ratios = sorted(row["mt"] / row["base"] for row in rows)
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]

    def share(key: str) -> float:
        return 100 * statistics.median(row[key] / row["base"] for row in rows)

    prefill = 100 * statistics.median((row["ins"] - row["base"]) / row["base"] for row in rows)
    stop_check = 100 * statistics.median((row["stops"] - row["base"]) / row["base"] for row in rows)
    print(f"samples that called the tool: {med['called']:.2f}; errors per rollout: {med['errors']:.0f}")
    print(f"multi-turn rollout: {med['mt']:.3f} s (median of {args.repeats}); same generated tokens in one pass: "
          f"{med['base']:.3f} s; with the inserted tokens in the prompts: {med['ins']:.3f} s")
    # the headline: the median of the pairs' ratios (each pair back to back, so a slow spell of the machine hits
    # both of a pair); the quartiles say how much the pairs disagreed
    print(f"overhead: {100 * (statistics.median(ratios) - 1):.1f} % of generate time (median of the pairs; quartiles "
          f"{100 * (q1 - 1):.1f} / {100 * (q3 - 1):.1f} %; ratio of the medians {100 * (med['mt'] / med['base'] - 1):.1f} %)")
    print(f"where it went (% of the one-pass time): tool calls {share('tool'):.1f} (overlapping the decoding), "
          f"prefill of the inserted tokens {prefill:.1f}, checking the turns' stop strings {stop_check:.1f}, "
          f"tokenizing the results {share('tokenize'):.1f}, "
          f"bookkeeping between turns {share('other'):.1f}")
    # The critical path in engine steps: a pass lasts as many steps as its longest sample; a multi-turn rollout
    # also waits for its slowest sample's tool call (idle: nothing left to step) and re-reads the inserted tokens.
    print(f"engine steps: multi-turn {med['steps']:.0f} ({1000 * med['gen'] / max(med['steps'], 1):.2f} ms each, "
          f"{share('gen'):.1f} % of the one-pass time in steps), one pass {med['base_steps']:.0f} "
          f"({1000 * med['base'] / max(med['base_steps'], 1):.2f} ms each); idle, every unfinished sample waiting on "
          f"its tool: {share('idle'):.1f} %")
    decode_ms = 1000 * (med["gen"] - med["joined"]) / max(med["steps"] - med["joined_steps"], 1)
    print(f"front end (the process stepping the engine): inside get_output, the core's outputs, multi-turn "
          f"{share('core'):.1f} % of the one-pass time ({med['outputs']:.0f} outputs, "
          f"{1000 * med['core'] / max(med['outputs'], 1):.2f} ms each), one pass {share('base_core'):.1f} % "
          f"({med['base_outputs']:.0f}, {1000 * med['base_core'] / max(med['base_outputs'], 1):.2f} ms each); "
          f"add_request {1000 * med['add'] / max(med['adds'], 1):.3f} ms each ({med['adds']:.0f} requests, "
          f"{share('add'):.1f} %); the rest of each pass is the front end's own work")
    print(f"  of the multi-turn steps: {med['joined_steps']:.0f} right after requests joined (the prompts, samples "
          f"back from a tool: their prefill beside the others' decoding), {1000 * med['joined'] / max(med['joined_steps'], 1):.2f} "
          f"ms each, {share('joined'):.1f} % of the one-pass time; the others {decode_ms:.2f} ms each")


if __name__ == "__main__":
    raise SystemExit(main())
