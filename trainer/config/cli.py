"""Command-line parsing of :class:`trainer.config.TrainerConfig`, built from its fields.

Every flag field becomes ``--<name>`` (booleans are store_true switches, as in OpenRLHF); types,
defaults, help and groups come from the field, so the flag list exists only in ``trainer.config.schema``.
Choices and bounds are *not* enforced by argparse but by ``TrainerConfig`` validation, so that all
problems of a command line are reported together.

An unknown flag is a usage error (exit 2) naming the flag and the closest known one. OpenRLHF flags
that this trainer deliberately does not implement get a specific message instead, so they are never
silently ignored.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trainer.config.errors import unknown_name_problem
from trainer.config.fields import FlagSpec, flag_specs, split_list
from trainer.config.schema import TrainerConfig

# OpenRLHF train_ppo_ray flags that are not implemented here, with what to do instead.
UNSUPPORTED_OPENRLHF_FLAGS: dict[str, str] = {
    "reward_pretrain": "reward models run as a remote service: use --remote_rm_url, or --reward_fn",
    "reward_num_nodes": "reward models run as a remote service (--remote_rm_url)",
    "reward_num_gpus_per_node": "reward models run as a remote service (--remote_rm_url)",
    "colocate_actor_ref": "only --colocate_all_models is supported",
    "colocate_critic_reward": "only --colocate_all_models is supported",
    "ref_reward_offload": "not implemented",
    "vllm_sync_with_ray": "weights are synced with --vllm_sync_backend nccl|gloo",
    "async_train": "only synchronous training is implemented",
    "use_dynamic_batch": "dynamic batching is not implemented",
    "ring_attn_size": "ring attention is not implemented",
    "ds_tensor_parallel_size": "DeepSpeed tensor parallelism is not implemented",
    "lora_rank": "LoRA is not implemented",
    "load_in_4bit": "quantised training is not implemented",
    "pretrain_data": "PPO-ptx is not implemented",
    "ptx_coef": "PPO-ptx is not implemented",
    "kl_target": "only a fixed KL coefficient (--init_kl_coef) is implemented",
    "enable_ema": "EMA weights are not implemented",
    "eval_dataset": "evaluation during training is not implemented",
    "eval_steps": "evaluation during training is not implemented",
    "save_value_network": "the critic is not saved",
    "freezing_actor_steps": "not implemented",
    "dynamic_filtering": "not implemented",
    "reward_clip_range": "not implemented",
    "max_len": "deprecated in OpenRLHF: use --prompt_max_len and --generate_max_len",
    "agent_func_path": "agent rollouts are not implemented",
    "local_rank": "ranks are assigned by Ray, not by a launcher",
}

_METAVARS = {int: "N", float: "X", str: "STR"}
_HELP_EPILOG = (
    "Flags follow OpenRLHF's openrlhf.cli.train_ppo_ray. Validation checks the whole configuration "
    "and reports every problem at once; paths are not checked here (the job checks them at start-up)."
)


def _converter(spec: FlagSpec) -> Callable[[str], Any]:
    """argparse ``type=`` for a flag: base type, 'none' for optional flags, comma lists."""

    def convert(text: str) -> Any:
        if spec.optional and text.strip().lower() == "none":
            return None
        if spec.is_list:
            return split_list(text)
        return spec.base(text)

    convert.__name__ = "comma-separated list" if spec.is_list else spec.base.__name__  # argparse error text
    return convert


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """An argparse parser with one option per flag field of :class:`TrainerConfig`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s --pretrain MODEL --prompt_data DATA (--remote_rm_url URL | --reward_fn NAME) [--flag ...]",
        description="OpenRLHF-style PPO / REINFORCE-family training on Ray (DeepSpeed actors, vLLM rollouts).",
        epilog=_HELP_EPILOG,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in flag_specs(TrainerConfig):
        meta = spec.meta
        group = groups.get(meta.group) or groups.setdefault(meta.group, parser.add_argument_group(meta.group))
        kwargs: dict[str, Any] = {
            "dest": spec.name,
            "default": spec.default,
            "help": meta.help.replace("%", "%%"),
        }
        if spec.base is bool:
            group.add_argument(spec.cli, action="store_true", **kwargs)
            continue
        kwargs["type"] = _converter(spec)
        if spec.choices is not None:
            kwargs["metavar"] = "{" + ",".join(str(c) for c in spec.choices) + "}"
        else:
            kwargs["metavar"] = meta.metavar or _METAVARS[spec.base]
        if meta.const is not None:
            kwargs.update(nargs="?", const=meta.const)
        group.add_argument(spec.cli, **kwargs)
    return parser


def known_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string the parser accepts (``--help`` included)."""
    return sorted(s for action in parser._actions for s in action.option_strings)


def unknown_arguments_problems(extras: Sequence[str], known: list[str]) -> list[str]:
    """One message per argument argparse could not place: unsupported, misspelt or stray."""
    problems = []
    after_flag = False
    for arg in extras:
        if arg.startswith("-") and arg not in ("-", "--"):
            name = arg.split("=", 1)[0]
            bare = name.lstrip("-")
            if bare in UNSUPPORTED_OPENRLHF_FLAGS:
                problems.append(
                    f"{name}: OpenRLHF flag not supported here ({UNSUPPORTED_OPENRLHF_FLAGS[bare]})"
                )
            else:
                problems.append(unknown_name_problem(bare, [k.lstrip("-") for k in known], prefix="--"))
            after_flag = "=" not in arg
        elif not after_flag:  # a value right after an unknown flag is that flag's value: reported already
            problems.append(f"unexpected argument {arg!r}: all options are --flags")
        else:
            after_flag = False
    return problems


def parse_known(
    argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> tuple[TrainerConfig, argparse.Namespace]:
    """Parse ``argv`` and validate it into a :class:`TrainerConfig`.

    ``parser`` may be :func:`build_parser`'s parser with extra options added (e.g. ``--print-config``);
    those come back in the namespace. Unknown flags exit 2 via ``parser.error``; invalid values raise
    :class:`trainer.config.ConfigError` listing every problem.
    """
    parser = parser or build_parser()
    namespace, extras = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    problems = unknown_arguments_problems(extras, known_flags(parser))
    if problems:
        parser.error("\n".join(["unrecognised arguments:", *(f"  - {p}" for p in problems)]))
    values = {spec.name: getattr(namespace, spec.name) for spec in flag_specs(TrainerConfig)}
    for name in values:
        delattr(namespace, name)
    return TrainerConfig(**values), namespace


def parse_args(argv: Sequence[str] | None = None) -> TrainerConfig:
    """Parse and validate a trainer command line (see :func:`parse_known`)."""
    return parse_known(argv)[0]
