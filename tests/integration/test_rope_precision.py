"""The policy's RoPE under ZeRO-3 with bf16 stays in float32, as a plain load and vLLM keep it.

DeepSpeed's ``zero.Init``, which ``from_pretrained`` runs under ZeRO-3, casts the rotary embedding's
``inv_freq`` buffer to bf16 along with the weights. The angle ``position x inv_freq`` then drifts along
the sequence. On a model whose attention is sharp (a random Qwen2-shaped model with its q/k projections
scaled up, standing in for a trained one), the policy's log-probs over 1,000 tokens went 6x further from
the float32 model's than the bf16 weights alone take them (measured 2026-11-27: 0.068 vs 0.011). This
was a trainer–engine mismatch on every long sequence (NeMo Automodel fixed the same cast in its models,
PR 2549). One DeepSpeed rank (gloo) loads the model the way ``ModelWorker.init_model`` does, in a
process of its own (``HfDeepSpeedConfig`` is global while it lives)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT, free_port

pytestmark = pytest.mark.integration

SCRIPT = r"""
import json, os, sys
import torch
sys.path.insert(0, sys.argv[3])
from transformers import AutoModelForCausalLM
from trainer.learn.model_worker import ModelWorker, padded_logprobs

path = sys.argv[1]
torch.manual_seed(0)
ids = torch.randint(5, 100, (2, 1024))
mask = torch.ones_like(ids)

def plain(dtype, rope_dtype):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").eval()
    r = m.model.rotary_emb
    r.inv_freq = r.inv_freq.float().to(rope_dtype)
    return m

with torch.no_grad():  # before DeepSpeed: plain loads, no zero.Init
    exact_model = plain(torch.float32, torch.float32)
    exact_freq = exact_model.model.rotary_emb.inv_freq.clone()
    exact = padded_logprobs(exact_model, ids, mask, 1000).float()
    bf16_rope = padded_logprobs(plain(torch.bfloat16, torch.bfloat16), ids, mask, 1000).float()
    fp32_rope = padded_logprobs(plain(torch.bfloat16, torch.float32), ids, mask, 1000).float()

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                  LOCAL_WORLD_SIZE="1")
import deepspeed
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo")
worker = ModelWorker(0, 1)
worker.init_model(path, zero_stage=3, bf16=True)
rotary = worker.engine.module.model.rotary_emb
policy = worker.logprobs(ids, mask, 1000).float()
print(json.dumps({
    "dtype": str(rotary.inv_freq.dtype), "original_dtype": str(rotary.original_inv_freq.dtype),
    "equal": bool(torch.equal(rotary.inv_freq.cpu(), exact_freq)),
    "policy": (policy - exact).abs().mean().item(),
    "bf16_rope": (bf16_rope - exact).abs().mean().item(),
    "fp32_rope": (fp32_rope - exact).abs().mean().item(),
}))
"""


@pytest.fixture(scope="module")
def sharp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Qwen2 in bf16 (as checkpoints ship) whose attention is sharp: q/k projections x 6."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=2048, max_position_embeddings=2048,
                         rope_theta=1_000_000.0)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(6.0)
    out = tmp_path_factory.mktemp("rope") / "sharp"
    model.to(torch.bfloat16).save_pretrained(out)
    return out


def test_the_policy_keeps_rope_in_float32_under_zero3_bf16(sharp_model: Path) -> None:
    got = subprocess.run([sys.executable, "-c", SCRIPT, str(sharp_model), str(free_port()), str(PROJECT)],
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    res = json.loads(got.stdout.strip().splitlines()[-1])
    assert res["dtype"] == "torch.float32" and res["original_dtype"] == "torch.float32", res
    assert res["equal"], "the recomputed frequencies differ from a plain float32 load's"
    # The case this guards against is large here, and the fix brings the policy to the bf16 weights' own error.
    assert res["bf16_rope"] > 3 * res["fp32_rope"], res
    assert res["policy"] < 1.5 * res["fp32_rope"], res
