"""A 2-rank DeepSpeed ZeRO-3 group on Ray (gloo, CPU) built by ActorGroup: exact log-probs, learning,
gathered weights, and a checkpoint resume whose next step equals the uninterrupted one."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a private throwaway cluster; never the user's ~/.ray token
    temp = f"/tmp/rlrun-pytest-{os.getpid()}"
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    yield
    ray.shutdown()
    import shutil

    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trainer.tiny import make_model

    return str(make_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, num_layers=2, num_heads=4))


def _batch(tiny_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    texts = ["1+2=3", "the answer is \\boxed{7}", "4+4=8", "9-3=6"]
    enc = tok(texts, return_tensors="pt", padding=True)
    num_actions = 3
    mask = enc["attention_mask"][:, -num_actions:].float()
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "action_mask": mask}


def _hf_logprobs(tiny_path_or_state, batch, state=None):
    from transformers import AutoModelForCausalLM

    from trainer.learn.losses import log_probs_from_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_path_or_state, dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state, strict=True)
    am = batch["attention_mask"]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=am,
                       position_ids=(am.cumsum(-1) - 1).clamp(min=0)).logits
    n = batch["action_mask"].size(1)
    return log_probs_from_logits(logits[:, :-1], batch["input_ids"][:, 1:])[:, -n:]


@pytest.fixture(scope="module")
def group(ray_local, tiny):
    from trainer.learn.group import ActorGroup, GroupSpec
    from trainer.learn.model_worker import ModelWorker

    g = ActorGroup(ModelWorker, GroupSpec("policy", num_nodes=1, gpus_per_node=2, use_gpus=False,
                                          cpus_per_actor=0.5))
    numels = g.run("init_model", tiny, zero_stage=3, learning_rate=5e-3, micro_batch=4, grad_accum=1)
    assert numels[0] == numels[1] > 0
    yield g
    g.shutdown()


def test_zero3_logprobs_equal_the_plain_model(group, tiny):
    batch = _batch(tiny)
    per_rank = group.run("logprobs", batch["input_ids"], batch["attention_mask"], 3)
    assert torch.equal(per_rank[0], per_rank[1])
    torch.testing.assert_close(per_rank[0], _hf_logprobs(tiny, batch), rtol=0, atol=1e-5)


def test_training_lowers_the_loss_and_gathered_weights_reproduce_the_group(group, tiny):
    batch = _batch(tiny)
    losses = [group.run_sharded("train_sft", [[batch], [batch]])[0] for _ in range(8)]
    assert losses[-1] < 0.8 * losses[0], losses
    state = group.run("full_state")
    assert state[1] is None and set(state[0]) and all(t.dtype == torch.float32 for t in state[0].values())
    logp = group.run("logprobs", batch["input_ids"], batch["attention_mask"], 3)[0]
    torch.testing.assert_close(logp, _hf_logprobs(tiny, batch, state=state[0]), rtol=0, atol=1e-5)
    assert not torch.allclose(logp, _hf_logprobs(tiny, batch))  # it really moved


def test_checkpoint_resume_gives_the_same_next_step(group, tiny, tmp_path):
    batch = _batch(tiny)
    from trainer import checkpoint

    checkpoint.save(tmp_path, "global_step5", {"policy": group}, {"step": 5})
    uninterrupted = [group.run_sharded("train_sft", [[batch], [batch]])[0] for _ in range(2)]
    found = checkpoint.newest(tmp_path)
    assert found is not None and found.tag == "global_step5" and found.complete
    client = checkpoint.load(found, {"policy": group})
    assert client["step"] == 5
    resumed = [group.run_sharded("train_sft", [[batch], [batch]])[0] for _ in range(2)]
    assert resumed == uninterrupted


def _fresh_run(tiny: str, prime: bool) -> tuple[list[float], dict, list[dict[str, float]]]:
    """A new 2-rank policy group (gradient checkpointing on, as on the GPUs), primed or not, then two
    optimizer steps: their losses, the gathered weights, each rank's start-up marks."""
    from trainer.learn.group import ActorGroup, GroupSpec
    from trainer.learn.model_worker import ModelWorker

    # a name of its own: the module's group (its placement group "rlrun-policy") is alive beside it
    g = ActorGroup(ModelWorker, GroupSpec("primed" if prime else "plain", num_nodes=1, gpus_per_node=2,
                                          use_gpus=False, cpus_per_actor=0.5))
    try:
        g.run("init_model", tiny, zero_stage=3, learning_rate=5e-3, micro_batch=4, grad_accum=1,
              gradient_checkpointing=True)
        if prime:
            g.run("prime", 4, True)
        batch = _batch(tiny)
        losses = [g.run_sharded("train_sft", [[batch], [batch]])[0] for _ in range(2)]
        return losses, g.run("full_state")[0], g.run("startup")
    finally:
        g.shutdown()


def test_priming_changes_nothing_the_run_learns(ray_local, tiny):
    """--prime_models runs a forward and a backward before step 1: the two steps after it, and the weights they
    leave, equal a run without it to the bit (a gradient of the priming's backward left in DeepSpeed's
    buffers, or a random draw, would show here)."""
    plain_losses, plain_state, plain_marks = _fresh_run(tiny, prime=False)
    primed_losses, primed_state, marks = _fresh_run(tiny, prime=True)
    assert all(m["primed"] > m["ready"] for m in marks) and not any("primed" in m for m in plain_marks)
    assert primed_losses == plain_losses
    assert set(primed_state) == set(plain_state)
    for name, tensor in plain_state.items():
        assert torch.equal(primed_state[name], tensor), name
