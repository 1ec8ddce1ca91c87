"""Where the run stands, and its checkpoints: what the trainer saves and how it resumes.

:class:`RunState` is the run's own state (rollout steps done, optimizer steps taken, the prompt sampler's
position, the reward normaliser): a checkpoint's ``client_state.json`` beside the models' DeepSpeed state.
:class:`Checkpoints` saves it with the policy's (and critic's) groups and resumes from the newest complete
checkpoint. How a checkpoint is written, found and loaded (atomically, torn ones skipped, another GPU count
through DeepSpeed's universal checkpoint) is :mod:`trainer.checkpoint`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer import checkpoint


@dataclass
class RunState:
    """The run's position (``sampler``: the prompt sampler; ``norm``: the reward normaliser, or None)."""

    sampler: Any
    norm: Any = None
    step: int = 0  # rollout steps done
    opt_step: int = 0  # optimizer steps taken: the position in the LR schedule
    sampler_state: dict[str, Any] = field(init=False)  # the sampler after the last batch trained on

    def __post_init__(self) -> None:
        self.sampler_state = self.sampler.state_dict()

    def client(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (``client_state.json``)."""
        return {"step": self.step, "opt_step": self.opt_step, "sampler": self.sampler_state,
                "norm": self.norm.state_dict() if self.norm else None}

    def restore(self, client: dict[str, Any]) -> None:
        """Back to where a checkpoint's client state says the run was."""
        self.step = client["step"]
        self.opt_step = client.get("opt_step", 0)
        self.sampler.load_state_dict(client["sampler"])
        self.sampler_state = self.sampler.state_dict()
        if self.norm is not None and client.get("norm"):
            self.norm.load_state_dict(client["norm"])


class Checkpoints:
    """The run's checkpoints under --ckpt_path.

    Args:
        cfg: the validated TrainerConfig.
        state: the run's state.
        groups: the model groups a checkpoint holds, by name (``policy``, and ``critic`` with PPO's GAE; the
            reference model is rebuilt: --pretrain, the warm-up).
        push: hands the policy's weights to the engines (after a resume).
    """

    def __init__(self, cfg: Any, state: RunState, groups: dict[str, Any], push: Callable[[], int]) -> None:
        self.cfg, self.state, self.groups, self.push = cfg, state, groups, push

    def save(self, tag: str | None = None, *, hf: bool | None = None, root: str | Path | None = None) -> Path:
        """The policy's (and critic's) DeepSpeed state and the run's state, written atomically under --ckpt_path,
        or under ``root`` (the best one of --save_best, :mod:`trainer.rollout.evaluate`); ``hf`` (default
        --save_hf_ckpt) adds the HF model. ``tag`` None: ``global_step<N>``, which becomes ``latest``, older ones
        past --max_ckpt_num go. A tag of the caller's: kept beside them, replaced atomically when saved again,
        never ``latest``, never pruned. Returns the checkpoint's directory."""
        cfg = self.cfg
        save_hf = cfg.save_hf_ckpt if hf is None else hf
        return checkpoint.save(Path(root or cfg.ckpt_path), tag or f"global_step{self.state.step}", self.groups,
                               self.state.client(), hf=self.groups["policy"] if save_hf else None,
                               latest=tag is None, keep=cfg.max_ckpt_num if tag is None else None)

    def resume(self) -> int | None:
        """Continue from the newest complete checkpoint in --ckpt_path (torn ones are named and skipped), on this
        run's placement: a group saved by another number of ranks loads DeepSpeed's universal checkpoint. The
        engines get the resumed policy's weights. Returns the step resumed at, or None: there was no checkpoint,
        the run starts fresh."""
        found = checkpoint.newest(Path(self.cfg.ckpt_path))
        if found is None:
            print(f"no complete checkpoint in {self.cfg.ckpt_path}; starting fresh", flush=True)
            return None
        self.state.restore(checkpoint.load(found, self.groups, universal=self.cfg.use_ds_universal_ckpt))
        self.push()
        print(f"resumed from {found.path} (step {self.state.step})", flush=True)
        return self.state.step
