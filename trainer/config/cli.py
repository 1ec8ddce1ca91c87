"""Command-line parsing of :class:`trainer.config.TrainerConfig`, built from its fields.

Every flag field becomes ``--<name>`` (booleans are store_true switches, as in OpenRLHF; two-number
flags take ``LOW HIGH``); types, defaults, help and groups come from the field, so the flag list exists
only in ``trainer.config.schema``. Choices and bounds are *not* enforced by argparse but by
``TrainerConfig`` validation, so that all problems of a command line are reported together.

OpenRLHF's flags come from the table in ``trainer.config.openrlhf``: a flag that works differently here
has the difference in its ``--help``; a refused flag is parsed the way OpenRLHF parses it (so its value
is not mistaken for a stray argument) and stops the parse with its reason, unless its value means what
this trainer does anyway (``--ring_attn_size 1``). A verl ``key=value`` override gets the flag that
carries its meaning (``trainer.config.verl``). Any other unknown flag is a usage error (exit 2) naming
the closest known one.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trainer.config.errors import unknown_name_problem
from trainer.config.fields import FlagSpec, flag_specs, from_text
from trainer.config.openrlhf import DOTTED, refusal
from trainer.config.openrlhf import FLAGS as OPENRLHF_FLAGS
from trainer.config.schema import TrainerConfig
from trainer.config.verl import override_hint

_REFUSED_DEST = "openrlhf_refused__"

_METAVARS = {int: "N", float: "X", str: "STR"}
_HELP_EPILOG = (
    "Flags follow OpenRLHF's openrlhf.cli.train_ppo_ray; trainer/config/openrlhf.py (python -m "
    "trainer.config.openrlhf) lists every OpenRLHF flag: supported, supported with a difference (shown "
    "in the help above) or refused with the reason. Validation checks the whole configuration and reports "
    "every problem at once; paths are not checked here (the job checks them at start-up)."
)


def _converter(spec: FlagSpec) -> Callable[[str], Any]:
    """argparse ``type=`` for a flag: its text read by :func:`trainer.config.fields.from_text` (each number of a
    two-number flag on its own: argparse hands them over one at a time)."""
    one = dataclasses.replace(spec, is_pair=False, optional=False) if spec.is_pair else spec

    def convert(text: str) -> Any:
        return from_text(one, text)

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
    dotted: dict[str, list[str]] = {}  # OpenRLHF's other spellings of a flag: dotted (>= 0.10), or renamed here
    for old, ours in DOTTED.items():
        dotted.setdefault(ours, []).append("--" + old)
    for row in OPENRLHF_FLAGS.values():
        if row.ours and row.status != "refused":
            dotted.setdefault(row.ours, []).append("--" + row.name)
    for spec in flag_specs(TrainerConfig):
        names = [spec.cli, *dotted.get(spec.name, [])]
        meta = spec.meta
        group = groups.get(meta.group) or groups.setdefault(meta.group, parser.add_argument_group(meta.group))
        kwargs: dict[str, Any] = {
            "dest": spec.name,
            "default": spec.default,
            "help": _help(spec).replace("%", "%%"),
        }
        if spec.base is bool:
            group.add_argument(*names, action="store_true", **kwargs)
            continue
        kwargs["type"] = _converter(spec)
        if spec.choices is not None:
            kwargs["metavar"] = "{" + ",".join(str(c) for c in spec.choices) + "}"
        else:
            kwargs["metavar"] = meta.metavar or _METAVARS[spec.base]
        if spec.is_pair:
            kwargs["nargs"] = 2
        if meta.const is not None:
            kwargs.update(nargs="?", const=meta.const)
        group.add_argument(*names, **kwargs)
    _add_refused_openrlhf_flags(parser)
    return parser


def _help(spec: FlagSpec) -> str:
    row = next((r for r in OPENRLHF_FLAGS.values() if r.flag == spec.name), None)
    if row is not None and row.status == "differs":
        return f"{spec.meta.help} OpenRLHF difference: {row.note}."
    return spec.meta.help


def _add_refused_openrlhf_flags(parser: argparse.ArgumentParser) -> None:
    """OpenRLHF's refused flags, parsed as OpenRLHF parses them and hidden from --help (the table lists them)."""
    for row in OPENRLHF_FLAGS.values():
        if row.status != "refused":
            continue
        kwargs: dict[str, Any] = {"dest": _REFUSED_DEST + row.name, "default": argparse.SUPPRESS,
                                  "help": argparse.SUPPRESS}  # fmt: skip
        if row.nargs == 0:
            parser.add_argument(f"--{row.name}", action="store_true", **kwargs)
        else:
            parser.add_argument(f"--{row.name}", nargs=None if row.nargs == 1 else row.nargs, **kwargs)


def refused_flag_problems(namespace: argparse.Namespace) -> list[str]:
    """One message per refused OpenRLHF flag given (with a value that is not its 'off' value); the
    flags' entries are removed from ``namespace``."""
    problems = []
    for dest in [d for d in vars(namespace) if d.startswith(_REFUSED_DEST)]:
        value = getattr(namespace, dest)
        delattr(namespace, dest)
        name = dest[len(_REFUSED_DEST):]
        why = refusal(name, value if isinstance(value, str) else None)
        if why:
            problems.append(why)
    return problems


def known_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string the parser accepts (``--help`` included, refused OpenRLHF flags not)."""
    return sorted(s for action in parser._actions if not action.dest.startswith(_REFUSED_DEST)
                  for s in action.option_strings)  # fmt: skip


def unknown_arguments_problems(extras: Sequence[str], known: list[str]) -> list[str]:
    """One message per argument argparse could not place: unsupported, misspelt or stray."""
    problems = []
    after_flag = False
    for arg in extras:
        if arg.startswith("-") and arg not in ("-", "--"):
            bare = arg.split("=", 1)[0].lstrip("-")
            problems.append(unknown_name_problem(bare, [k.lstrip("-") for k in known], prefix="--"))
            after_flag = "=" not in arg
        elif hint := override_hint(arg):
            problems.append(hint)
            after_flag = False
        elif not after_flag:  # a value right after an unknown flag is that flag's value: reported already
            problems.append(f"unexpected argument {arg!r}: all options are --flags")
        else:
            after_flag = False
    return problems


def read_argv(
    argv: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[dict[str, Any], argparse.Namespace, list[str]]:
    """``(flag values, other options, problems)`` of a command line: the problems are refused OpenRLHF
    flags, verl overrides, unknown flags and stray arguments (value problems are TrainerConfig's)."""
    namespace, extras = parser.parse_known_args(list(argv))
    problems = refused_flag_problems(namespace) + unknown_arguments_problems(extras, known_flags(parser))
    values = {spec.name: getattr(namespace, spec.name) for spec in flag_specs(TrainerConfig)}
    for name in values:
        delattr(namespace, name)
    for name, value in values.items():  # argparse gives a two-number flag as a list
        if isinstance(value, list):
            values[name] = tuple(value)
    return values, namespace, problems


def parse_known(
    argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> tuple[TrainerConfig, argparse.Namespace]:
    """Parse ``argv`` and validate it into a :class:`TrainerConfig`.

    ``parser`` may be :func:`build_parser`'s parser with extra options added (e.g. ``--print-config``);
    those come back in the namespace. Unknown flags exit 2 via ``parser.error``; invalid values raise
    :class:`trainer.config.ConfigError` listing every problem.
    """
    parser = parser or build_parser()
    values, namespace, problems = read_argv(sys.argv[1:] if argv is None else argv, parser)
    if problems:
        parser.error("\n".join(["unrecognised arguments:", *(f"  - {p}" for p in problems)]))
    return TrainerConfig(**values), namespace


def parse_args(argv: Sequence[str] | None = None) -> TrainerConfig:
    """Parse and validate a trainer command line (see :func:`parse_known`)."""
    return parse_known(argv)[0]
