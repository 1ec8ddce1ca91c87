"""The trainer's command line, both ways: a :class:`~trainer.config.TrainerConfig` written as
``python -m trainer.train_ppo_ray --flag value ...`` (what ``rlrun submit --preset`` runs), and such a command
read back into a config by the trainer's own parser and checks (what ``rlrun submit -- python -m
trainer.train_ppo_ray ...`` checks before it submits)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rlrun.presets import TRAINER_MODULE, PresetError
from trainer.config import ConfigError, TrainerConfig
from trainer.config.cli import build_parser, read_argv
from trainer.config.fields import flag_specs


def flag_args(cfg: TrainerConfig, named: Iterable[str] = ()) -> list[str]:
    """The trainer flags that reproduce ``cfg``: the ``named`` ones (those a preset or --set gives, so
    the command reads like the preset) and every other flag whose resolved value is not its default."""
    named = set(named)
    args: list[str] = []
    for spec in flag_specs(TrainerConfig):
        value = getattr(cfg, spec.name)
        if value == spec.default and (spec.name not in named or spec.base is bool):
            continue
        if spec.base is bool:
            args.append(spec.cli)
        elif value is None:
            args += [spec.cli, "none"]
        elif spec.is_list:
            args += [spec.cli, ",".join(value)]
        elif spec.is_pair:
            args += [spec.cli, *(repr(v) for v in value)]
        else:
            args += [spec.cli, repr(value) if isinstance(value, float) else str(value)]
    return args


def entrypoint(cfg: TrainerConfig, named: Iterable[str] = ()) -> list[str]:
    """``python -m trainer.train_ppo_ray --flag value ...`` for ``cfg`` (see :func:`flag_args`)."""
    return ["python", "-m", TRAINER_MODULE, *flag_args(cfg, named)]


def trainer_argv(command: list[str]) -> list[str] | None:
    """The flags of ``python -m trainer.train_ppo_ray FLAGS...``, None for any other command."""
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1:3] == ["-m", TRAINER_MODULE]:
        return command[3:]
    return None


def config_from_argv(argv: list[str]) -> TrainerConfig:
    """Validate a trainer command line as the trainer will (its parser, its checks); errors list every problem."""
    parser = build_parser(prog=f"python -m {TRAINER_MODULE}")
    parser.add_argument("--print-config", action="store_true")

    def error(message: str):
        raise PresetError("the trainer's command line is not valid", [message])

    parser.error = error  # argparse would print and exit
    values, _, problems = read_argv(argv, parser)
    if problems:
        raise PresetError("the trainer's command line is not valid", problems)
    try:
        return TrainerConfig(**values)
    except ConfigError as err:
        raise PresetError("the trainer's command line is not a valid job", err.problems) from None
