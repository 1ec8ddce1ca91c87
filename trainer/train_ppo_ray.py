"""Entry point: ``python -m trainer.train_ppo_ray [OpenRLHF train_ppo_ray flags] [--print-config]``.

Parses and validates the flags into a :class:`trainer.config.TrainerConfig`. With ``--print-config`` it
prints the resolved configuration (derived sizes included) as JSON and exits 0 without importing Ray,
DeepSpeed or torch; otherwise it hands the config to ``trainer.loop.run``.

Exit codes: 0 success; 1 a fault the job ends on (a start-up deadline, an engine replaced more often than
--max_engine_restarts, a service down past its outage deadline), printed as one line on stderr; 2 usage or
validation error (every problem listed on stderr) or training loop not installed.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Sequence

from trainer.config import ConfigError
from trainer.config.cli import build_parser, parse_known

PROG = "python -m trainer.train_ppo_ray"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the entry point; returns the process exit code."""
    parser = build_parser(prog=PROG)
    parser.add_argument(
        "--print-config",
        dest="print_config",
        action="store_true",
        help="Print the validated configuration (with derived sizes) as JSON and exit; starts nothing.",
    )
    try:
        config, options = parse_known(argv, parser)
    except ConfigError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    if options.print_config:
        print(config.to_json(redact=True))
        return 0
    try:
        loop = importlib.import_module("trainer.loop")
    except ModuleNotFoundError as err:
        if err.name != "trainer.loop":
            raise
        print(f"{PROG}: training loop not available yet (trainer/loop.py is missing)", file=sys.stderr)
        return 2
    from trainer.deadlines import fault_line

    try:
        result = loop.run(config)
    except Exception as err:
        line = fault_line(err)
        if line is None:
            raise
        _disconnect()  # Ray would go on printing its workers' last lines after this one
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)
        return 1
    return result if isinstance(result, int) else 0


def _disconnect() -> None:
    """Leave the Ray cluster (if joined), so that the fault's line is the job's last."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        with contextlib.suppress(Exception):  # the fault is what matters here
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
