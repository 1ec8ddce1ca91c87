"""Multi-turn search rollouts against the real retrieval service (`python -m trainer.retrieval serve`, BM25
over a tiny-search corpus, bearer token): the HF engine's turn loop in-process, and two PPO steps with a
critic and state masking through `python -m trainer.train_ppo_ray` with a vLLM engine on the session's
private Ray, the engine's process calling the service.

The policy is a tiny model taught in the fixture (plain torch, a few seconds) to write
`<search>NAME</search>` for every question, so every sample calls the tool: a random-init model would
never close a search tag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT

pytestmark = pytest.mark.integration

MAX_NEW = 96
TOKEN = "multiturn-test-token"


def _teach_search(model_dir, prompt: str, target: str, steps: int = 400) -> None:
    """Fit the model to answer `prompt` with `target` (then EOS is not taught: it goes on searching)."""
    from trainer.tiny import teach

    loss = teach(model_dir, [(prompt, target)], steps, stop_below=0.01)
    assert loss < 0.05, f"the tiny model did not learn the search call (loss {loss:.3f})"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The taught model, the questions (the first entity asked about with every prompt: one query, found),
    and the retrieval service over the corpus on a free loopback port; stopped by its PID at the end."""
    from transformers import AutoTokenizer

    from trainer.retrieval.local import local_service
    from trainer.tiny import SEARCH_INSTRUCTION, make_model, make_search_data

    d = tmp_path_factory.mktemp("multiturn")
    make_model(d / "model", hidden_size=128, num_layers=2, num_heads=2)  # head_dim 64: vLLM's CPU backend
    make_search_data(d / "data", n=8, distractors=8)
    corpus = [json.loads(line) for line in (d / "data" / "corpus.jsonl").read_text().splitlines()]
    name, code = corpus[0]["contents"].split("\n")[1].split(" is ")
    # every question asks about the same entity (the one the model learns to search for)
    questions = [{"question": [{"role": "user", "content": SEARCH_INSTRUCTION.format(name)}], "golden_answers": [code]}
                 for _ in range(8)]
    (d / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    tok = AutoTokenizer.from_pretrained(d / "model")
    prompt = tok.apply_chat_template(questions[0]["question"], tokenize=False, add_generation_prompt=True)
    _teach_search(d / "model", prompt, f"<search>{name}</search>")
    (d / "token").write_text(TOKEN)
    (d / "token").chmod(0o600)
    with local_service(d / "data" / "corpus.jsonl", d, token_file=d / "token") as svc:
        yield {"dir": d, "port": svc.port, "prompt": prompt, "name": name, "code": code}


def test_hf_engine_searches_and_masks_the_inserted_passages(env, monkeypatch):
    from trainer.rollout.hf_engine import HfEngine
    from trainer.rollout.multiturn import information_block

    monkeypatch.setenv("RLRUN_RETRIEVER_TOKEN_FILE", str(env["dir"] / "token"))
    engine = HfEngine(str(env["dir"] / "model"))
    url = f"http://{{node_ip}}:{env['port']}/retrieve"  # outside Ray {node_ip} is 127.0.0.1
    samples, stats = engine.generate_with_tools([env["prompt"]] * 2, n=2, temperature=0.0, max_new_tokens=MAX_NEW,
                                                seed=1, retriever_url=url, retriever_topk=2, max_turns=2)
    assert len(samples) == 4 and stats["tool_calls"] >= 4 and stats["generate_s"] > 0
    tok = engine.tokenizer
    for s in samples:
        # The counts agree with the tokens: one information block per tool call, one run of generated
        # (mask 1) tokens per generation turn; the taught model searches at once.
        response = tok.decode(s.response_token_ids)
        generated_runs = sum(1 for i, m in enumerate(s.action_mask) if m == 1 and (i == 0 or s.action_mask[i - 1] == 0))
        assert s.tool_calls >= 1 and response.count("<information>") == s.tool_calls, (s.tool_calls, response)
        assert generated_runs == s.turns, (generated_runs, s.turns, s.action_mask)
        assert len(s.action_mask) == len(s.response_token_ids) <= MAX_NEW
        first_search = tok(f"<search>{env['name']}</search>", add_special_tokens=False).input_ids
        assert s.response_token_ids[:len(first_search)] == first_search
        # the first information block: the service's best passage for the name is the entity's own
        inserted = [t for t, m in zip(s.response_token_ids, s.action_mask, strict=True) if m == 0]
        text = tok.decode(inserted)
        assert text.startswith(f'\n\n<information>Doc 1(Title: "{env["name"]}") {env["name"]} is {env["code"]}')
        # exactly the inserted tokens are masked: the mask's zeros spell the information blocks
        block = tok(information_block(["x"]), add_special_tokens=False).input_ids
        assert s.action_mask[len(first_search)] == 0 and s.action_mask[len(first_search) - 1] == 1
        assert s.action_mask.count(0) >= len(block)


def test_search_is_one_tool_among_several(env, monkeypatch):
    """The job's tool flags (trainer.tools.registry.settings) with search and python offered: the taught model
    searches as it did through Search-R1's own arguments, token for token, and the calls are counted per tool."""
    from trainer.config import TrainerConfig
    from trainer.rollout.hf_engine import HfEngine
    from trainer.tools.registry import settings

    monkeypatch.setenv("RLRUN_RETRIEVER_TOKEN_FILE", str(env["dir"] / "token"))
    engine = HfEngine(str(env["dir"] / "model"))
    url = f"http://127.0.0.1:{env['port']}/retrieve"
    cfg = TrainerConfig(pretrain="/m", prompt_data="/d", reward_fn="exact_match", tools=("search", "python"),
                        retriever_url=url, retriever_topk=2, max_turns=2)
    kwargs = dict(n=2, temperature=0.0, max_new_tokens=MAX_NEW, seed=1)
    both, stats = engine.generate_with_tools([env["prompt"]], tools=settings(cfg), **kwargs)
    alone, _ = engine.generate_with_tools([env["prompt"]], retriever_url=url, retriever_topk=2, max_turns=2, **kwargs)
    assert [(s.response_token_ids, s.action_mask, s.tool_calls) for s in both] == [
        (s.response_token_ids, s.action_mask, s.tool_calls) for s in alone]
    assert stats["tool/search/calls"] == sum(s.tool_calls for s in both) >= 2 and "tool/python/calls" not in stats


def test_a_bad_token_is_a_clear_error(env, monkeypatch):
    from trainer.retrieval.client import RetrievalError
    from trainer.rollout.hf_engine import HfEngine

    monkeypatch.setenv("RLRUN_RETRIEVER_TOKEN", "wrong")
    engine = HfEngine(str(env["dir"] / "model"))
    with pytest.raises(RetrievalError, match="403"):
        engine.generate_with_tools([env["prompt"]], temperature=0.0, max_new_tokens=MAX_NEW,
                                   retriever_url=f"http://127.0.0.1:{env['port']}/retrieve", max_turns=1)


def test_two_ppo_steps_with_search_and_state_masking(env, private_ray):
    d = env["dir"]
    out = d / "run"
    flags = ["--pretrain", str(d / "model"), "--prompt_data", str(d / "questions.jsonl"), "--input_key", "question",
             "--label_key", "golden_answers", "--apply_chat_template", "--reward_fn", "exact_match",
             # The private Ray's node registered 127.0.0.1, which Ray replaces by the machine's routable address,
             # where nothing of this test listens: the URL names the loopback service itself ({node_ip} is
             # resolved in the unit tests, and on the netns clusters of molecule multinode).
             "--retriever_url", f"http://127.0.0.1:{env['port']}/retrieve", "--max_turns", "2",
             "--retriever_topk", "2", "--state_masking",
             # eager: the loop with a critic is tested here, not vLLM's compilation (the curve test below keeps
             # tiny-search's compiled engine; test_vllm_engine's in-process one is compiled too)
             "--rollout_backend", "vllm", "--vllm_num_engines", "1", "--enable_prefix_caching", "--enforce_eager",
             "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--ref_num_nodes", "1",
             "--ref_num_gpus_per_node", "1", "--critic_num_nodes", "1", "--critic_num_gpus_per_node", "1",
             "--advantage_estimator", "gae", "--init_kl_coef", "0.001", "--kl_estimator", "k1",
             "--temperature", "0.5", "--n_samples_per_prompt", "2", "--rollout_batch_size", "4", "--micro_rollout_batch_size", "4",
             "--train_batch_size", "8", "--micro_train_batch_size", "4", "--generate_max_len", str(MAX_NEW),
             "--prompt_max_len", "64", "--max_samples", "8", "--num_episodes", "1", "--zero_stage", "3",
             "--actor_learning_rate", "1e-6", "--critic_learning_rate", "1e-5",
             "--save_path", str(out), "--ckpt_path", str(out / "ckpt")]
    # The token's value: the session's Ray head was started without a node token file (a cluster's nodes
    # have RLRUN_RETRIEVER_TOKEN_FILE in their own environment, molecule multinode checks that path).
    env_vars = {**private_ray["env"], "RAY_ADDRESS": private_ray["address"], "HOME": str(d),
                "RLRUN_RETRIEVER_TOKEN": TOKEN}
    result = subprocess.run([sys.executable, "-m", "trainer.train_ppo_ray", *flags], cwd=PROJECT, env=env_vars,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the taught model searches (sampling at 0.5 may derail a few), each sample at most max_turns times
        assert r["search/rate"] >= 0.5 and 0.5 <= r["search/calls"] <= 2
        assert r["search/turns"] >= 1.5 and r["search/inserted_tokens"] > 10
        assert 0 <= r["reward/exact_match"] <= 1 and "loss/critic" in r and "kl/mean" in r
        # the passages are no actions: the counted response tokens exclude them
        assert r["response_length/mean"] + r["search/inserted_tokens"] <= MAX_NEW
        assert r["rollout/tool_s"] > 0 and r["rollout/generate_s"] > 0
    assert "search/rate=" in result.stdout and "reward/exact_match=" in result.stdout


# Metrics that measure time, not what was learned: the rest must repeat exactly.
CLOCK_KEYS = ("time", "timing/", "rollout/generate_s", "rollout/tool_s", "rollout/other_s", "startup/")


def test_the_multi_turn_curve_repeats_step_by_step(env, private_ray):
    """Two identical GRPO runs with searches (tiny-search's shape: sampled at temperature 1, one search of top
    1, state masking, prefix caching), at the same time on the private Ray, so their engines, tool threads
    and retrieval requests interleave differently: every step's metrics are equal, bit for bit, but the
    clocks (issue 33: tiny-search's curve must be the same on every run)."""
    d = env["dir"]
    flags = ["--pretrain", str(d / "model"), "--prompt_data", str(d / "questions.jsonl"), "--input_key", "question",
             # a reward that differs between almost any two responses: every group trains from the first step
             "--label_key", "golden_answers", "--apply_chat_template", "--reward_fn", "tests.integration.loop_rewards:char_mean",
             "--retriever_url", f"http://127.0.0.1:{env['port']}/retrieve", "--max_turns", "1", "--retriever_topk", "1",
             "--state_masking", "--rollout_backend", "vllm", "--vllm_num_engines", "1", "--enable_prefix_caching",
             "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--advantage_estimator", "group_norm",
             "--init_kl_coef", "0", "--temperature", "1.0", "--n_samples_per_prompt", "4", "--rollout_batch_size", "4",
             "--micro_rollout_batch_size", "4", "--train_batch_size", "16", "--micro_train_batch_size", "8",
             "--generate_max_len", str(MAX_NEW), "--prompt_max_len", "64", "--max_samples", "8", "--num_episodes", "2",
             "--zero_stage", "3", "--actor_learning_rate", "1e-4", "--seed", "3"]
    env_vars = {**private_ray["env"], "RAY_ADDRESS": private_ray["address"], "HOME": str(d),
                "RLRUN_RETRIEVER_TOKEN": TOKEN}
    runs = []
    for name in ("first", "second"):
        out = d / f"repeat-{name}"
        log = open(d / f"repeat-{name}.log", "w")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen([sys.executable, "-m", "trainer.train_ppo_ray", *flags, "--save_path", str(out),
                                 "--ckpt_path", str(out / "ckpt")], cwd=PROJECT, env=env_vars, stdout=log,
                                stderr=subprocess.STDOUT)
        runs.append((proc, log, out))
    curves = []
    for proc, log, out in runs:
        try:
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        assert proc.returncode == 0, Path(log.name).read_text()[-5000:]
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        curves.append([{k: v for k, v in r.items() if not k.startswith(CLOCK_KEYS)} for r in rows])
    first, second = curves
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    assert any(r["search/calls"] > 0 for r in first) and any(r["loss/policy"] != 0 for r in first)
    for a, b in zip(first, second, strict=True):
        assert a == b, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
