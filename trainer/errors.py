"""An error told in one line: what the job (an engine's fault, a deadline) and rlrun's fabric check (a rank's
failed test) report, in place of a traceback. Standard library only."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(error: BaseException | str, limit: int = 300) -> str:
    """``error`` as one short line: its type and the first line of its message; for a Ray task or actor error, the
    exception the remote side raised (its ``cause``), not the remote traceback Ray wraps around it. Whitespace is
    collapsed, and a line past ``limit`` characters is cut, ending in "..."."""
    if isinstance(error, str):
        text = error
    else:
        cause = getattr(error, "cause", None)  # RayTaskError: the exception the actor raised
        if isinstance(cause, BaseException) and cause is not error:
            error = cause
        first = next((ln.strip() for ln in str(error).splitlines() if ln.strip()), "")
        text = f"{type(error).__name__}: {first}" if first else type(error).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
