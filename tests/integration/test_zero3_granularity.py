"""ZeRO-3 trains the policy: its gradients reach the optimizer and the loss moves.

From 2026-11-24 to 2026-11-27 the trainer set DeepSpeed's ``stage3_module_granularity_threshold`` on CUDA (5e6
parameters per module). On models up to ~1e9 parameters (the demos' tiny models, the 0.5B shape) that made the
WHOLE model one ZeRO-3 leaf module. DeepSpeed reduces a leaf module's gradients from a backward hook on inputs
that need a gradient (its PRs 5008 and 5074); a model's input is token ids, so no gradient ever reached the
optimizer: on an H200 the tiny-search warm-up's loss stayed at 4.61 for 400 steps, and the 0.5B "speed-up" it
was kept for (train phase 4.41 -> 1.68 s) was a step that trained nothing. The setting is off now and the
trainer refuses one that makes the whole model a unit (``check_granularity``).

One DeepSpeed rank on gloo, in a process of its own (``HfDeepSpeedConfig`` is global while it lives), the
tiny model, the policy's own ``ModelWorker``:

- the trainer's configuration: the supervised loss falls and the gradient norm is not 0;
- the whole-model granularity, built behind the trainer's back (CPU tensors lack ``record_stream``, which
  DeepSpeed's leaf path calls: a no-op stands in): the gradient norm is exactly 0 and the loss does not move,
  and the trainer's supervised step refuses to go on;
- ``init_model`` with that setting is refused, naming it.
"""

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
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                  LOCAL_WORLD_SIZE="1")
import deepspeed
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo")
from transformers import AutoModelForCausalLM
from transformers.integrations import HfDeepSpeedConfig
from trainer.experience import build_experience
from trainer.learn.model_worker import ModelWorker, ds_config

path, mode = sys.argv[1], sys.argv[4]
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(5, 60, (6,), generator=g).tolist() for _ in range(8)]
exp = build_experience(prompts, [p[:4] for p in prompts], 0)
mb = {"input_ids": exp.input_ids, "attention_mask": exp.attention_mask, "action_mask": exp.action_mask}
worker = ModelWorker(0, 1)
if mode == "refused":
    try:
        worker.init_model(path, zero_stage=3, micro_batch=8, learning_rate=2e-3, granularity_threshold=5_000_000)
    except ValueError as e:
        print(json.dumps({"refused": str(e)}))
    else:
        print(json.dumps({"refused": None}))
    sys.exit(0)
if mode == "whole":  # what the trainer did on CUDA: the setting, the model one unit
    torch.Tensor.record_stream = lambda self, stream=None: None
    config = ds_config(3, False, 8, 1, granularity_threshold=5_000_000)
    keep = HfDeepSpeedConfig(config)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    worker.engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    worker.dtype, worker.temperature = torch.float32, 1.0
else:
    worker.init_model(path, zero_stage=3, micro_batch=8, learning_rate=2e-3)
losses, norms, refused = [], [], None
if mode == "whole":  # the trainer's warm-up step refuses a loss whose gradient never arrives
    try:
        worker.train_sft([mb])
    except RuntimeError as e:
        refused = str(e)
for _ in range(6):
    if mode == "whole":  # the same step, without the trainer's check
        from trainer.learn.losses import masked_mean
        worker.engine.train()
        loss = -masked_mean(worker._action_logprobs(mb["input_ids"], mb["attention_mask"], 4), mb["action_mask"])
        worker.engine.backward(loss)
        worker.engine.step()
        losses.append(loss.item())
    else:
        losses.append(worker.train_sft([mb]))
    norms.append(float(worker.engine.get_global_grad_norm()))
print(json.dumps({"losses": losses, "norms": norms, "refused": refused,
                  "zero": {k: v for k, v in worker.engine.config["zero_optimization"].items() if "granularity" in k}}))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.tiny import make_model

    out = tmp_path_factory.mktemp("granularity") / "tiny"
    make_model(out, hidden_size=128)
    return out


def _run(model: Path, mode: str) -> dict:
    got = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(free_port()), str(PROJECT), mode],
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout.strip().splitlines()[-1])


def test_the_policy_trains_under_zero3_and_a_whole_model_unit_would_not(tiny: Path) -> None:
    trained = _run(tiny, "trainer")
    assert min(trained["norms"]) > 0, trained
    assert trained["losses"][-1] < 0.8 * trained["losses"][0], trained
    whole = _run(tiny, "whole")
    assert whole["zero"] == {"stage3_module_granularity_threshold": 5_000_000}, whole
    # DeepSpeed 0.19.8: no gradient reaches the optimizer; only AdamW's weight decay moves the weights
    assert whole["norms"] == [0.0] * 6, whole
    # and the trainer's supervised step says so instead of training nothing
    assert "the gradient that reached the optimizer is 0" in (whole["refused"] or ""), whole
    assert max(whole["losses"]) - min(whole["losses"]) < 1e-3, whole
    refused = _run(tiny, "refused")["refused"]
    assert refused is not None and "makes the whole model one ZeRO-3 leaf module" in refused, refused
