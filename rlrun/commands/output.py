"""Everything the commands print, rendered here: tables, plain columns, JSON, lists of problems, times.

stdout keeps what scripts read (ids, tables, JSON); stderr gets what people read (progress, hints,
errors). Every command that prints a table also takes ``--json`` (:data:`json_option`), which prints
the same rows as JSON instead.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def say(text: str) -> None:
    """A line for people on stderr (stdout keeps what scripts read: ids, tables, JSON)."""
    err_console.print(text, highlight=False, markup=False, soft_wrap=True)


def echo(text: str) -> None:
    """A line for scripts on stdout, as it is."""
    click.echo(text)


def emit_json(data: Any, **kwargs: Any) -> None:
    """``data`` as one line of JSON on stdout."""
    click.echo(json.dumps(data, **kwargs))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A titled table on stdout (rich: fitted to the terminal)."""
    out = Table(title=title)
    for column in columns:
        out.add_column(column)
    for row in rows:
        out.add_row(*row)
    console.print(out)


def columns(lines: list[tuple[str, ...]]) -> str:
    """Plain aligned columns (like `kubectl get`): never cut, whatever the terminal's width, so ids can be
    copied and grepped."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def plural(n: int, word: str) -> str:
    """``1 problem``, ``2 problems``."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def problem_list(problems: Iterable[object]) -> str:
    """One ``  - problem`` line each."""
    return "\n".join(f"  - {p}" for p in problems)


def host_error(host: str, error: str) -> None:
    """A host's error on stderr, the host in red."""
    err_console.print(f"[red]{host}[/red]: {error}", markup=True, highlight=False)


def fmt_time(ms: float | None) -> str:
    """A Ray timestamp (milliseconds) as local time; ``-`` for none."""
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def fmt_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``-`` for none."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"
