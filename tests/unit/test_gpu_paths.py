"""GPU-path fixes that a CPU can check (found preparing the H200 runs of bench/gpu/).

- ModelWorker and CriticWorker: micro-batches arrive through Ray as CPU tensors and DeepSpeed does not move a forward's
  inputs, so on a GPU rank the embedding lookup failed; the worker now moves them to ``engine.device``.
  Checked with a stub engine on the ``meta`` device, which takes no CPU tensor either.
- HfEngine: the log-probs of the sampled tokens are now taken step by step on the model's device instead of
  stacking every step's full-vocabulary logits and taking the softmax on the CPU; they must stay the model's
  log-probs after the temperature that a teacher-forced forward pass gives.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

META = torch.device("meta")


class StubEngine:
    """Stands for a DeepSpeedEngine whose module lives on ``device`` (meta: shapes only)."""

    device = META

    def __init__(self, vocab: int = 11):
        self.vocab = vocab
        self.seen: list[torch.device] = []

    def __call__(self, input_ids, attention_mask, position_ids):
        self.seen += [input_ids.device, attention_mask.device, position_ids.device]
        return SimpleNamespace(logits=torch.empty(*input_ids.shape, self.vocab, device=self.device))


def _worker():
    pytest.importorskip("ray")
    from trainer.learn.model_worker import ModelWorker

    worker = ModelWorker(0, 1)
    worker.engine = StubEngine()
    worker.temperature = 1.0
    return worker


def test_forward_inputs_are_moved_to_the_engine_device():
    worker = _worker()
    ids = torch.randint(0, 11, (2, 6))
    logp = worker._action_logprobs(ids, torch.ones(2, 6, dtype=torch.long), 3)
    assert worker.engine.seen == [META, META, META]
    assert logp.shape == (2, 3) and logp.device == META


def test_micro_batch_tensors_go_to_the_engine_device_and_the_rest_is_kept():
    worker = _worker()
    mb = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "advantages": torch.zeros(2, 3), "tag": "x"}
    moved = worker._to_device(mb)
    assert moved["input_ids"].device == META and moved["advantages"].device == META
    assert moved["input_ids"].dtype == torch.long and moved["tag"] == "x"
    assert mb["input_ids"].device.type == "cpu"  # the caller's batch is left as it was


class StubCriticEngine(StubEngine):
    def __call__(self, input_ids, attention_mask):
        self.seen += [input_ids.device, attention_mask.device]
        return torch.zeros(*input_ids.shape, device=self.device)

    def train(self):
        pass

    def backward(self, loss):
        self.seen.append(loss.device)

    def step(self):
        pass


def test_critic_moves_micro_batches_to_the_engine_device():
    pytest.importorskip("ray")
    from trainer.learn.critic_worker import CriticWorker

    critic = CriticWorker(0, 1)
    critic.engine = StubCriticEngine()
    mb = {"input_ids": torch.zeros(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5, dtype=torch.long),
          "action_mask": torch.ones(2, 3), "values": torch.zeros(2, 3), "returns": torch.ones(2, 3)}
    with pytest.raises((NotImplementedError, RuntimeError)):  # .item() of a meta loss: after the forward
        critic.train_critic([mb])
    assert critic.engine.seen[:3] == [META, META, META]  # inputs, then the loss, all on the engine's device


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    from trainer.rollout.hf_engine import HfEngine
    from trainer.tiny import make_model

    path = make_model(tmp_path_factory.mktemp("hf") / "model", hidden_size=64, num_layers=2, num_heads=4)
    return HfEngine(str(path), device="cpu")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_engine_logprobs_are_the_models_logprobs_after_the_temperature(tiny_engine, temperature):
    """The log-probs of the distribution sampled from: a teacher-forced forward's logits / temperature (what
    the policy computes, so rollout/logprob_mismatch compares like with like)."""
    samples = tiny_engine.generate(["3+4=", "copy 4821="], n=3, temperature=temperature, max_new_tokens=12, seed=3)
    assert len(samples) == 6
    model = tiny_engine.model
    for s in samples:
        ids = torch.tensor([s.prompt_token_ids + s.response_token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        p = len(s.prompt_token_ids)
        want = torch.log_softmax(logits[p - 1 : -1] / temperature, dim=-1).gather(
            -1, torch.tensor(s.response_token_ids).unsqueeze(-1)).squeeze(-1)
        assert len(s.logprobs) == len(s.response_token_ids) > 0
        assert torch.allclose(torch.tensor(s.logprobs), want, atol=1e-4), (s.logprobs, want.tolist())


def test_flash_attn_is_refused_clearly_without_cuda_and_sdpa_is_the_default():
    import pytest

    from trainer.learn.model_worker import attn_implementation

    assert attn_implementation(False) == "sdpa"
    with pytest.raises(RuntimeError, match="--flash_attn needs CUDA GPUs"):
        attn_implementation(True)


def test_liger_kernels_are_refused_clearly_without_cuda_and_off_by_default():
    import pytest
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.learn.model_worker import liger_kernels

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    norm = type(model.model.norm)
    assert liger_kernels(model, False) is False
    with pytest.raises(RuntimeError, match="--use_liger_kernel needs CUDA GPUs .* this node has none"):
        liger_kernels(model, True)
    assert type(model.model.norm) is norm and "forward" not in vars(model.model.norm)  # nothing half-changed


def test_zero3_has_no_module_granularity_setting_unless_asked():
    """ZeRO-3 fetches and reduces per module, as DeepSpeed does by default, on CUDA and CPU alike: the module
    granularity setting that was on for CUDA made small models one leaf module whose gradients were never
    reduced (see trainer.learn.model_worker.GRANULARITY_THRESHOLD). An explicit value is kept (ZeRO-3 only)."""
    from trainer.learn.model_worker import PERSISTENCE_THRESHOLD, ds_config

    key = "stage3_module_granularity_threshold"
    zero = ds_config(3, True, 8, 8)["zero_optimization"]
    assert key not in zero and zero["stage3_param_persistence_threshold"] == PERSISTENCE_THRESHOLD
    assert key not in ds_config(3, False, 8, 8)["zero_optimization"]
    assert key not in ds_config(2, True, 8, 8, granularity_threshold=7)["zero_optimization"]
    assert ds_config(3, True, 8, 8, granularity_threshold=7)["zero_optimization"][key] == 7


def test_a_granularity_that_makes_the_whole_model_one_unit_is_refused():
    """trainer's count of the model's granularity equals DeepSpeed's own (its ZeRO-3 offload's recursive
    count run on the same modules); a threshold at or above it (the whole model one leaf module: no gradient
    would ever be reduced) is refused naming both numbers, one below it (inner modules only) is kept."""
    import sys

    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

    from trainer.learn.model_worker import check_granularity, ds_config, top_granularity
    from trainer.tiny import make_model

    class Tower(torch.nn.Module):  # a container inside, a parameter-free child, a module of its own parameters
        def __init__(self, width: int, depth: int):
            super().__init__()
            self.embed = torch.nn.Embedding(50, width)
            self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                                                  torch.nn.LayerNorm(width)) for _ in range(depth))
            self.scale = torch.nn.Parameter(torch.ones(width))

    def deepspeeds(model: torch.nn.Module) -> int:
        for p in model.parameters():
            p.ds_numel = p.numel()
        probe = SimpleNamespace(min_granularity_value=sys.maxsize, min_granularity_layer=None, granularity_info=set())
        probe._get_granularity_recursively = lambda m: DeepSpeedZeRoOffload._get_granularity_recursively(probe, m)
        probe._get_granularity_recursively(model)
        return model.ds_model_granularity

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        make_model(d, hidden_size=64, num_layers=2, num_heads=4)
        from transformers import AutoModelForCausalLM

        tiny = AutoModelForCausalLM.from_pretrained(d)
    for model in (Tower(16, 3), Tower(300, 2), tiny, torch.nn.Linear(4, 4)):
        assert top_granularity(model) == deepspeeds(model), type(model).__name__

    whole = top_granularity(tiny)
    with pytest.raises(ValueError, match=rf"makes the whole model one ZeRO-3 leaf module \(its granularity is {whole}\)"
                                         rf".*expected 0 \(off\) or a threshold below {whole}"):
        check_granularity(tiny, ds_config(3, False, 8, 8, granularity_threshold=5_000_000))
    check_granularity(tiny, ds_config(3, False, 8, 8, granularity_threshold=whole - 1))  # inner modules only
    check_granularity(tiny, ds_config(3, False, 8, 8))


def test_an_engine_started_beside_loading_models_sizes_its_kv_cache_from_its_share(tmp_path):
    """--vllm_start_with_models: the KV cache is the engine's share of the GPU less its weights per TP rank and
    the margin (not what vLLM would profile as free while the models allocate beside it)."""
    from trainer.rollout.vllm_engine import (
        KV_MARGIN_BYTES,
        KV_MARGIN_SHARE,
        checkpoint_bytes,
        upfront_kv_bytes,
    )

    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 3000)
    (tmp_path / "model-00002.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_bytes(str(tmp_path)) == 4000
    gib = 2**30
    total, weights = 80 * gib, 15 * gib  # a 7B in bf16 on an 80 GB card, TP 2, half the card
    kv = upfront_kv_bytes(total, 0.5, weights, 2)
    assert kv == int(40 * gib - 7.5 * gib - KV_MARGIN_BYTES - KV_MARGIN_SHARE * 40 * gib)
    with pytest.raises(ValueError, match="--vllm_gpu_memory_utilization 0.1 of 80.0 GiB leaves no KV cache after 15.00 GiB"):
        upfront_kv_bytes(total, 0.1, weights, 1)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors or \\*.bin weights"):
        checkpoint_bytes(str(tmp_path / "config.json").rsplit("/", 1)[0] + "/nope")


def test_partial_adam_offload_reaches_deepspeeds_config_and_is_valid_there():
    """--adam_offload_ratio becomes ZeRO-3's offload_optimizer.ratio (the 32B one-node variant keeps half the
    Adam states on the GPUs), DeepSpeed's own config model accepts it, and a full offload leaves it out."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from trainer.learn.model_worker import ds_config

    half = ds_config(3, True, 2, 8, adam_offload=True, offload_ratio=0.5)["zero_optimization"]
    assert half["offload_optimizer"]["ratio"] == 0.5 and half["offload_optimizer"]["device"] == "cpu"
    assert DeepSpeedZeroConfig(**half).offload_optimizer.ratio == 0.5
    full = ds_config(3, True, 2, 8, adam_offload=True)["zero_optimization"]
    assert "ratio" not in full["offload_optimizer"]
    assert "offload_optimizer" not in ds_config(3, True, 2, 8, offload_ratio=0.5)["zero_optimization"]


def test_cpu_adam_gets_its_share_of_the_nodes_cores(monkeypatch):
    """Ray starts workers with OMP_NUM_THREADS=1; an offloading rank takes the cores it may run on divided
    among the group's ranks on its node (one process here: all of them)."""
    import os

    import torch

    from trainer.learn.model_worker import cpu_adam_threads

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        threads = cpu_adam_threads("10.0.0.1")
        assert threads == len(os.sched_getaffinity(0)) >= 1
        assert os.environ["OMP_NUM_THREADS"] == str(threads) and torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_a_rank_clears_a_killed_builds_lock_before_it_loads_cpu_adam(monkeypatch, tmp_path, capsys):
    """torch's extension cache outlives jobs; a lock a killed build left there an hour ago would make the rank's
    load of cpu_adam wait for ever: prepare_cpu_adam removes it (and gives the rank its threads)."""
    import os
    import time

    import torch

    from trainer.learn.model_worker import prepare_cpu_adam

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    lock = tmp_path / "cpu_adam" / "lock"
    lock.parent.mkdir()
    lock.touch()
    os.utime(lock, (time.time() - 7200, time.time() - 7200))
    before = torch.get_num_threads()
    try:
        assert prepare_cpu_adam("10.0.0.1") == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)
    assert not lock.exists() and f"removed {lock}" in capsys.readouterr().out


class _StopAfterPolicy(Exception):
    pass


@pytest.mark.parametrize("with_models", [True, False])
def test_colocated_engines_started_with_the_models_start_before_the_policys_workers(tmp_path, monkeypatch,
                                                                                   with_models):
    """--vllm_start_with_models on GPUs: the policy's placement group is reserved first and the engines start in
    it before any model worker (2026-11-28, 7B on 4 H200s: started after the model groups' workers were up, the
    engines' processes began 41 s into the driver's, 28 s after the workers'), and the policy group then owns
    that placement group (it releases it at shutdown). Without the flag the colocated engines wait for the
    models: nothing starts before the policy group. Ray's calls are replaced where they would place actors on
    GPUs this machine does not have."""
    ray = pytest.importorskip("ray")
    import trainer.loop as loop
    from trainer.config.cli import parse_args
    from trainer.tiny import make_math_dataset, make_tokenizer

    make_tokenizer(tmp_path / "m")
    data = make_math_dataset(tmp_path / "d.jsonl", n=8)
    argv = ["--pretrain", str(tmp_path / "m"), "--prompt_data", str(data), "--input_key", "message",
            "--label_key", "answer", "--apply_chat_template", "--reward_fn",
            "tests.integration.loop_rewards:has_one", "--rollout_backend", "vllm", "--vllm_num_engines", "2",
            "--vllm_tensor_parallel_size", "2", "--colocate_all_models", "--vllm_enable_sleep", "--vllm_gpu_memory_utilization", "0.3",
            "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "4", "--ref_num_nodes", "1",
            "--ref_num_gpus_per_node", "4", "--advantage_estimator", "rloo", "--n_samples_per_prompt", "2",
            "--rollout_batch_size", "4", "--micro_rollout_batch_size", "2", "--micro_train_batch_size", "2",
            "--train_batch_size", "8", "--generate_max_len", "8", "--prompt_max_len", "32", "--bf16",
            "--save_path", str(tmp_path / "out"), *(["--vllm_start_with_models"] if with_models else [])]
    cfg = parse_args(argv)
    events: list[tuple] = []
    reserved = object()  # the policy's placement group, as reserve returns it
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 4.0, "CPU": 16.0})
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"GPU": 4.0, "CPU": 16.0}}])
    monkeypatch.setattr(loop, "reserve", lambda spec, timeout: events.append(("reserve", spec.name,
                                                                               spec.world_size)) or reserved)
    monkeypatch.setattr(loop, "bundle_nodes", lambda group: ["10.0.0.1"] * 4 if group is reserved else None)

    prewarm = object()  # the driver's kernel prewarm (trainer.loop.head_prewarm): the engines stop it

    def engines(cfg_, plan_, policy_pg=None, nodes=None, head_prewarm=None):
        events.append(("engines", policy_pg is reserved, tuple(nodes or ()), head_prewarm is prewarm))

    def group(worker_cls, spec, pg=None, *args, owns_pg=False, **kwargs):
        events.append(("group", spec.name, pg is reserved, owns_pg))
        raise _StopAfterPolicy

    monkeypatch.setattr(loop, "Engines", engines)
    monkeypatch.setattr(loop, "ActorGroup", group)
    with pytest.raises(_StopAfterPolicy):
        loop.Trainer(cfg, prewarm)
    if with_models:
        assert events == [("reserve", "policy", 4), ("engines", True, ("10.0.0.1",) * 4, True),
                          ("group", "policy", True, True)]
    else:
        assert events == [("group", "policy", False, False)]


class _Calls:
    """An actor group that records what it is asked to run (async_run returns one fake ref per call)."""

    def __init__(self, name: str, log: list[tuple]):
        self.name, self.log = name, log

    def async_run(self, method, *args, **kwargs):
        self.log.append((self.name, method, *args))
        return [f"{self.name}.{method}"]


@pytest.mark.parametrize(("extra", "primed"), [
    (["--prime_models", "--vllm_start_with_models"], True),
    (["--vllm_start_with_models"], False),  # off by default
])
def test_with_prime_models_the_models_are_primed_beside_the_engines_start(tmp_path, extra, primed):
    """Trainer._prime: the policy's forward and backward at its train micro-batch, the reference's forward at
    its rollout micro-batch (ModelWorker.prime), with --prime_models. Where colocated engines would size their
    KV cache from the memory free while they start (without --vllm_start_with_models) the flag is refused (the
    next test)."""
    import trainer.loop as loop
    from trainer.config.cli import parse_args

    argv = ["--pretrain", "m", "--prompt_data", "d.jsonl", "--reward_fn", "tests.integration.loop_rewards:has_one",
            "--rollout_backend", "vllm", "--vllm_num_engines", "2", "--colocate_all_models",
            "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "2", "--ref_num_nodes", "1",
            "--ref_num_gpus_per_node", "2", "--advantage_estimator", "rloo", "--n_samples_per_prompt", "2",
            "--rollout_batch_size", "4", "--micro_rollout_batch_size", "4", "--micro_train_batch_size", "2",
            "--train_batch_size", "8", "--save_path", str(tmp_path / "out"), *extra]
    trainer = loop.Trainer.__new__(loop.Trainer)
    trainer.cfg = parse_args(argv)
    log: list[tuple] = []
    trainer.policy, trainer.ref = _Calls("policy", log), _Calls("reference", log)
    refs = trainer._prime()
    if primed:
        assert log == [("policy", "prime", 2, True), ("reference", "prime", 4, False)]
        assert refs == ["policy.prime", "reference.prime"]
    else:
        assert log == [] and refs == []


def test_priming_beside_colocated_engines_that_profile_memory_as_they_start_is_refused():
    """--prime_models with --colocate_all_models and vLLM but not --vllm_start_with_models: refused before the
    job, naming the flag and why (the engines would count the priming's memory against their KV cache)."""
    from trainer.config.cli import parse_args
    from trainer.config.errors import ConfigError

    argv = ["--pretrain", "m", "--prompt_data", "d.jsonl", "--reward_fn", "math_verify", "--rollout_backend", "vllm",
            "--vllm_num_engines", "2", "--colocate_all_models", "--actor_num_nodes", "1",
            "--actor_num_gpus_per_node", "2", "--ref_num_nodes", "1", "--ref_num_gpus_per_node", "2",
            "--advantage_estimator", "rloo", "--n_samples_per_prompt", "2", "--prime_models"]
    with pytest.raises(ConfigError) as err:
        parse_args(argv)
    assert "--prime_models is only used with --vllm_start_with_models" in str(err.value)
    assert "counted against their KV cache" in str(err.value)
    assert parse_args([*argv, "--vllm_start_with_models"]).prime_models


def test_the_drivers_kernel_prewarm_starts_only_on_a_node_with_a_gpu(tmp_path, monkeypatch):
    """trainer.loop.head_prewarm: --vllm_prewarm_kernels on a driver's node without a GPU (this machine) starts
    no copy (the engines' own copies are each engine's business), and nothing without the flag."""
    import subprocess

    import trainer.loop as loop
    from trainer.config.cli import parse_args

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("a child started"))
    argv = ["--pretrain", str(tmp_path / "m"), "--prompt_data", str(tmp_path / "d.jsonl"), "--reward_fn",
            "tests.integration.loop_rewards:has_one", "--rollout_backend", "vllm", "--vllm_num_engines", "1",
            "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--ref_num_nodes", "1",
            "--ref_num_gpus_per_node", "1", "--advantage_estimator", "rloo", "--n_samples_per_prompt", "2",
            "--rollout_batch_size", "4", "--micro_rollout_batch_size", "2", "--micro_train_batch_size", "2",
            "--train_batch_size", "8", "--save_path", str(tmp_path / "out")]
    assert loop.head_prewarm(parse_args(argv)) is None
    assert loop.head_prewarm(parse_args([*argv, "--vllm_prewarm_kernels"])) is None
    assert started == []
