"""A log call that cannot flood the log: at most N lines a minute, then a count of the rest."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """Call ``emit(message, *args)`` at most ``per_minute`` times per minute.

    Further calls in the same minute are counted, not logged; the first call of a later
    minute first logs how many were left out. Thread-safe.
    """

    def __init__(
        self, emit: Callable[..., None], per_minute: int = 10, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if per_minute < 1:
            raise ValueError(f"per_minute must be >= 1, got {per_minute}")
        self._emit = emit
        self._per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._window = clock()
        self._count = 0
        self.suppressed = 0  # in the current minute

    def __call__(self, message: str, *args: object) -> bool:
        """Log (True) or count (False) one occurrence."""
        with self._lock:
            now = self._clock()
            if now - self._window >= 60.0:
                if self.suppressed:
                    self._emit("%d more like the following were not logged in the last minute", self.suppressed)
                self._window, self._count, self.suppressed = now, 0, 0
            if self._count >= self._per_minute:
                self.suppressed += 1
                return False
            self._count += 1
        self._emit(message, *args)
        return True
