"""The services' command lines, declared from a table.

Each service lists its flags as :class:`Flag` rows (the rows both services take are defined here once) and
:func:`add_flags` turns them into argparse arguments: every flag of two words or more is accepted as
``--kebab-case`` and ``--snake_case``; a bad value is one line on stderr under the program's name, exit
status 2, saying what was expected (:func:`one_line_parser`, :func:`port`, :func:`positive`). As the
trainer's flag table (``trainer/config/fields.py``), one row is the one description of a flag: its
spellings, type, default, help and group.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, NoReturn

__all__ = ["Flag", "ServiceConfigError", "add_flags", "fail", "one_line_parser", "port", "positive", "setup_logging"]


class ServiceConfigError(ValueError):
    """A service (the reward or the retrieval service) cannot start with this configuration; the message says why
    and what to do. (A trainer's flags that do not fit together are trainer.config.ConfigError, which lists every
    problem.)"""


def fail(prog: str, message: str) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` as one line on stderr and exit 2."""
    sys.stderr.write(f"{prog}: error: {' '.join(message.split())}\n")
    sys.exit(2)


def one_line_parser(prog: str) -> type[argparse.ArgumentParser]:
    """An ArgumentParser class whose errors (sub-commands' too) are one line under ``prog``, exit 2."""

    class OneLineParser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            fail(prog, message)

    return OneLineParser


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected a TCP port 1-65535") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range; expected a TCP port 1-65535")
    return value


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, finite and > 0 (NaN and infinity refused)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            article = "an" if kind.__name__[:1] in "aeiou" else "a"
            raise argparse.ArgumentTypeError(f"{text!r} is not {article} {kind.__name__}") from None
        if not value > 0 or (isinstance(value, float) and math.isinf(value)):
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a service.

    ``name`` is its kebab-case spelling without the dashes (``max-body-bytes``); the snake_case spelling is
    accepted too, and the parsed value is stored under ``dest`` (default: the snake_case name). A ``switch``
    takes no value (``store_true``). Rows with the same ``exclusive`` key are mutually exclusive; ``group``
    titles a help section.
    """

    name: str
    help: str | None = None
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    required: bool = False
    dest: str | None = None
    group: str | None = None
    exclusive: str | None = None

    @property
    def spellings(self) -> tuple[str, ...]:
        kebab, snake = f"--{self.name}", f"--{self.name.replace('-', '_')}"
        return (kebab,) if kebab == snake else (kebab, snake)

    def but(self, **changes: Any) -> Flag:
        """This row with some fields changed (a service's own default or help for a shared flag)."""
        return replace(self, **changes)


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> argparse.ArgumentParser:
    """Add ``flags`` to ``parser`` in order (groups made on first use) and return the parser."""
    groups: dict[str, Any] = {}
    for f in flags:
        target: Any = parser
        if f.group is not None:
            if f.group not in groups:
                groups[f.group] = parser.add_argument_group(f.group)
            target = groups[f.group]
        if f.exclusive is not None:
            key = f"exclusive:{f.exclusive}"
            if key not in groups:
                groups[key] = target.add_mutually_exclusive_group()
            target = groups[key]
        kwargs: dict[str, Any] = {"dest": f.dest or f.name.replace("-", "_"), "help": f.help}
        if f.switch:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(default=f.default, type=f.type, choices=f.choices, required=f.required)
        target.add_argument(*f.spellings, **kwargs)
    return parser


LOG_LEVELS = ("debug", "info", "warning", "error")


def setup_logging(level: str) -> None:
    """The services' log format on stderr (gunicorn's error log): time, process, level, logger."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")


# The rows both services take; a service changes a default or a help text with ``Flag.but``.
HOST = Flag("host", "address to bind (default 127.0.0.1)", default="127.0.0.1")
PORT = Flag("port", "TCP port", type=port)
TOKEN_FILE = Flag("token-file", "file (mode 0600) holding the bearer token", exclusive="auth")
NO_AUTH = Flag("no-auth", "serve without authentication (logs a warning)", switch=True, exclusive="auth")
WORKERS = Flag("workers", "gunicorn worker processes (default 1)", default=1, type=positive(int))
THREADS = Flag("threads", "threads per gunicorn worker (default 8)", default=8, type=positive(int))
HEAD_TIMEOUT = Flag("head-timeout", "seconds a client has to send a request's line and headers (default 10); "
                    "late ones get 408", default=10.0, type=positive(float))
BODY_TIMEOUT = Flag("body-timeout", "seconds a client has to send a request body once its headers are in "
                    "(default 60)", default=60.0, type=positive(float))
KEEPALIVE = Flag("keepalive", "seconds an idle kept-alive connection stays open (default 5)", default=5.0,
                 type=positive(float))
MAX_BODY_BYTES = Flag("max-body-bytes", "largest request body in bytes", type=positive(int))
MAX_CHARS = Flag("max-chars", "longest accepted string in a request", type=positive(int))
LOG_LEVEL = Flag("log-level", default="info", choices=LOG_LEVELS)
