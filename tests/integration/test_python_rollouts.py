"""Multi-turn rollouts with the python tool through real engines: the HF engine's turn loop in-process, and two GRPO
steps through `python -m trainer.train_ppo_ray` with a vLLM engine on the session's private Ray, the engine's process
running the sandboxes. The policy is a tiny model taught in the fixture (plain torch, a few seconds) to answer a
product with `<python>print(A*B)</python>`; what the sandbox printed is inserted, masked, and the model goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT

pytestmark = pytest.mark.integration

MAX_NEW = 96


def _teach(model_dir, pairs: list[tuple[str, str]], steps: int = 500) -> None:
    """Fit the model to answer each prompt with its target (EOS not taught)."""
    from trainer.tiny import teach

    teach(model_dir, pairs, steps)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A model taught to call python for two products, and the questions (the first product every time)."""
    from transformers import AutoTokenizer

    from trainer.tiny import PYTHON_INSTRUCTION, make_model

    d = tmp_path_factory.mktemp("python-rollouts")
    make_model(d / "model", hidden_size=128, num_layers=2, num_heads=2)  # head_dim 64: vLLM's CPU backend
    tok = AutoTokenizer.from_pretrained(d / "model")
    questions = [{"question": [{"role": "user", "content": PYTHON_INSTRUCTION.format(12, 34)}], "golden_answers": ["408"]}
                 for _ in range(8)]
    (d / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    prompt = tok.apply_chat_template(questions[0]["question"], tokenize=False, add_generation_prompt=True)
    other = tok.apply_chat_template([{"role": "user", "content": PYTHON_INSTRUCTION.format(56, 78)}], tokenize=False,
                                    add_generation_prompt=True)
    _teach(d / "model", [(prompt, "<python>print(12*34)</python>"), (other, "<python>print(56*78)</python>")])
    return {"dir": d, "prompt": prompt}


def _settings(**over):
    from trainer.config import TrainerConfig
    from trainer.tools.registry import settings

    cfg = TrainerConfig(pretrain="/m", prompt_data="/d", reward_fn="exact_match", tools=("python",), max_turns=2,
                        python_timeout=5.0, **over)
    return settings(cfg)


def test_hf_engine_runs_the_code_and_masks_its_output(env):
    from trainer.rollout.hf_engine import HfEngine

    engine = HfEngine(str(env["dir"] / "model"))
    samples, stats = engine.generate_with_tools([env["prompt"]] * 2, n=2, temperature=0.0, max_new_tokens=MAX_NEW,
                                                seed=1, tools=_settings())
    tok = engine.tokenizer
    call = tok("<python>print(12*34)</python>", add_special_tokens=False).input_ids
    block = tok("\n<output>\n408\n</output>\n", add_special_tokens=False).input_ids
    assert len(samples) == 4 and stats["tool/python/calls"] >= 4 and stats["tool/python/errors"] == 0
    for s in samples:
        assert s.response_token_ids[:len(call)] == call  # the taught call, greedy
        assert s.response_token_ids[len(call):len(call) + len(block)] == block  # what the sandbox printed
        assert s.action_mask[:len(call)] == [1] * len(call)
        assert s.action_mask[len(call):len(call) + len(block)] == [0] * len(block)
        # each call's output is one masked run of the response: the engine's count of calls must say as many
        masked_runs = sum(1 for k, m in enumerate(s.action_mask) if m == 0 and (k == 0 or s.action_mask[k - 1] == 1))
        assert s.tool_calls == masked_runs
        assert len(s.response_token_ids) <= MAX_NEW  # inserted outputs count against the token budget
    # a cap on the result text: the output is cut to 2 tokens and marked
    capped, _ = engine.generate_with_tools([env["prompt"]], n=1, temperature=0.0, max_new_tokens=MAX_NEW, seed=1,
                                           tools=_settings(tool_max_result_tokens=2))
    inserted = [t for t, m in zip(capped[0].response_token_ids, capped[0].action_mask, strict=True) if m == 0]
    assert tok.decode(inserted).startswith("\n<output>\n40\n...[truncated]\n</output>\n")


def test_two_grpo_steps_with_the_python_tool_on_vllm(env, private_ray):
    d = env["dir"]
    out = d / "run"
    flags = ["--pretrain", str(d / "model"), "--prompt_data", str(d / "questions.jsonl"), "--input_key", "question",
             "--label_key", "golden_answers", "--apply_chat_template", "--reward_fn", "exact_match",
             "--tools", "python", "--max_turns", "1", "--state_masking", "--python_timeout", "5",
             # eager: the python tool through the loop is tested here, not vLLM's compilation (test_multiturn's
             # curve test and test_vllm_engine keep compiled engines), ~18 s of CPU less
             "--rollout_backend", "vllm", "--vllm_num_engines", "1", "--enable_prefix_caching", "--enforce_eager",
             "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--advantage_estimator", "group_norm",
             "--init_kl_coef", "0", "--temperature", "0.5", "--n_samples_per_prompt", "4", "--rollout_batch_size", "4",
             "--micro_rollout_batch_size", "4", "--train_batch_size", "16", "--micro_train_batch_size", "8",
             "--generate_max_len", str(MAX_NEW), "--prompt_max_len", "64", "--max_samples", "8", "--num_episodes", "1",
             "--zero_stage", "3", "--actor_learning_rate", "1e-6", "--save_path", str(out), "--ckpt_path", str(out / "ckpt")]
    env_vars = {**private_ray["env"], "RAY_ADDRESS": private_ray["address"], "HOME": str(d)}
    result = subprocess.run([sys.executable, "-m", "trainer.train_ppo_ray", *flags], cwd=PROJECT, env=env_vars,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the taught model calls python (sampling at 0.5 may derail a few); its code runs and prints the product
        assert r["tools/rate"] >= 0.5 and r["tools/python/calls"] >= 0.5, r
        assert r["tools/python/errors"] <= 0.5, [ln for ln in (result.stdout + result.stderr).splitlines() if "error #" in ln]
        assert r["tools/inserted_tokens"] > 10 and "search/rate" not in r
        # the output is no action: the counted response tokens exclude it
        assert r["response_length/mean"] + r["tools/inserted_tokens"] <= MAX_NEW
        assert r["rollout/tool_s"] > 0
    assert "tools/rate=" in result.stdout and os.path.exists(out / "metrics.jsonl")
