"""The multi-turn loop of an older checkout against this one's, in ONE process on one engine (vLLM in-process,
the real retrieval service on loopback, the search tool), alternating, the same seeds: whether the samples are
equal token for token, and the new loop's time over the old one's per pair (a shared machine's load moves both
of a pair alike; two processes measured one after the other see different loads).

    git archive OLD_COMMIT | tar -x -C /tmp/old && python bench/multiturn_ab.py /tmp/old [--repeats 12]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path, help="an older checkout (its trainer/rollout/multiturn.py, or tools.py before issue 37, is the old loop)")
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    import multiturn as B
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from trainer.rollout import multiturn as new_tools
    from trainer.rollout.vllm_engine import VllmEngine
    from trainer.tiny import make_model
    from trainer.tools.registry import build_toolbox, search_settings
    rollout_dir = args.old / "trainer" / "rollout"  # the loop was rollout/tools.py before issue 37
    old_loop = rollout_dir / "multiturn.py" if (rollout_dir / "multiturn.py").exists() else rollout_dir / "tools.py"
    old_tools = load(old_loop, "old_rollout_tools")
    work = Path(tempfile.mkdtemp(prefix="bench-multiturn-ab-"))
    make_model(work / "model", hidden_size=128)
    questions, calls = B.task("search", work)
    tok = AutoTokenizer.from_pretrained(work / "model")
    prompts = [tok.apply_chat_template(q["question"], tokenize=False, add_generation_prompt=True) for q in questions]
    B.teach(work / "model", prompts, calls)
    try:
        with B.retrieval_service(work) as url:
            engine = VllmEngine(str(work / "model"), enable_prefix_caching=True, max_model_len=192, seed=0)
            ids = [list(tok(p).input_ids) for p in prompts[:8]]

            def tkz(text: str) -> list[int]:
                return list(tok(text, add_special_tokens=False).input_ids)

            box = build_toolbox(search_settings(url, 1, 1), tok)
            old_search = old_tools.SearchTool(url, 1)
            kw = dict(n=8, max_turns=1, max_new_tokens=128, temperature=1.0, top_p=1.0, eos_id=tok.eos_token_id)
            res = {"old": [], "new": [], "one": []}
            same = True
            for r in range(args.repeats + 1):  # the first pair warms up
                order = [("old", old_tools, old_search), ("new", new_tools, box)]
                if r % 2:  # each loop runs first in half the pairs
                    order.reverse()
                rows_by = {}
                for name, mod, tool in order:
                    engine.reset_prefix_cache()
                    t0 = time.perf_counter()
                    rows, _ = mod.run_tool_rollout_streaming(engine.stepper(), tkz, ids, tool=tool, seed=r, **kw)
                    dt = time.perf_counter() - t0
                    rows_by[name] = [(x.response, x.action_mask) for x in rows]
                    if r:
                        res[name].append(dt)
                same &= rows_by["old"] == rows_by["new"]
                engine.reset_prefix_cache()
                lengths = [max(sum(m), 1) for _, m in rows_by["new"]]
                params = [SamplingParams(temperature=1.0, max_tokens=k, min_tokens=k, ignore_eos=True, seed=r * 100_000 + i)
                          for i, k in enumerate(lengths)]
                ctx = [i for i in ids for _ in range(8)]
                t0 = time.perf_counter()
                engine.llm.generate([TokensPrompt(prompt_token_ids=c) for c in ctx], params, use_tqdm=False)
                if r:
                    res["one"].append(time.perf_counter() - t0)
            engine.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the model, data and index it made
    med = {k: statistics.median(v) for k, v in res.items()}
    new_over_old = sorted(n / o for n, o in zip(res["new"], res["old"], strict=True))
    print(f"load average {os.getloadavg()[0]:.1f}; samples equal token for token in every pair: {same}")
    q = len(new_over_old) // 4
    print(f"medians ({args.repeats} pairs): old {med['old']:.3f} s, new {med['new']:.3f} s, one pass {med['one']:.3f} s")
    print(f"new / old, median of the pairs: {statistics.median(new_over_old):.3f} (quartiles {new_over_old[q]:.3f} / "
          f"{new_over_old[-1 - q]:.3f})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
