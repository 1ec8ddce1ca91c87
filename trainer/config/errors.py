"""The configuration's error type and the "did you mean" hint (no other imports of the package)."""

from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """Invalid trainer configuration; ``problems`` lists every problem found (each names its flags)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        count = f"{len(self.problems)} problem" + ("s" if len(self.problems) != 1 else "")
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid trainer configuration ({count}):\n{lines}")


def unknown_name_problem(name: str, known: list[str], prefix: str = "") -> str:
    """'unknown flag X' plus the closest known name (difflib), if any is close."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    return f"unknown {'flag' if prefix else 'field'} {prefix}{name}{hint}"
