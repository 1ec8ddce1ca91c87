"""Reward server configuration: what create_app() needs, and where its bearer token comes from."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trainer.reward.extract import DEFAULT_STRATEGIES
from trainer.reward.forms import LENIENCIES
from trainer.services.cli import ServiceConfigError
from trainer.services.token import load_token_file

__all__ = ["TOKEN_ENV", "ServiceConfigError", "ServerConfig", "load_token_file"]

TOKEN_ENV = "RLRUN_REWARD_TOKEN"


@dataclass(frozen=True)
class ServerConfig:
    """Everything create_app() needs. Defaults are the production defaults.

    token / token_file / RLRUN_REWARD_TOKEN (first one set wins) give the bearer token;
    auth=False (--no-auth) disables authentication explicitly.
    """

    auth: bool = True
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    dataset: str | None = None
    input_key: str = "input"
    label_key: str = "answer"
    prompt_template: str = "none"
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    lenient: frozenset[str] = frozenset(LENIENCIES)  # trainer.reward.forms: units, styled_letters
    timeout: float = 3.0  # CPU seconds one item may use
    wall_timeout: float | None = None  # None: 10 * timeout + 30 (VerifyPool's backstop)
    verify_processes: int | None = None  # None: CPUs available
    max_verify_processes: int | None = None  # None: 4 * verify_processes + 4 (room for stuck items)
    max_digits: int = 100_000  # answers with bigger exact values score 0 as "too_complex"; 0: off
    max_body_bytes: int = 16 * 1024 * 1024
    max_items: int = 4096
    max_chars: int = 200_000
    max_answer_chars: int = 1000
    memory_limit_mb: int | None = 1024
    cache_size: int = 65536

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_items", "max_chars", "max_answer_chars"):
            if getattr(self, name) < 1:
                raise ServiceConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout <= 0:
            raise ServiceConfigError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.wall_timeout is not None and self.wall_timeout < self.timeout:
            raise ServiceConfigError(
                f"wall_timeout ({self.wall_timeout}) must be >= timeout ({self.timeout}): it is the backstop "
                "for items that do not get their CPU time"
            )
        if self.verify_processes is not None and self.verify_processes < 1:
            raise ServiceConfigError(f"verify_processes must be >= 1, got {self.verify_processes}")
        if self.max_digits < 0:
            raise ServiceConfigError(f"max_digits must be >= 0 (0 disables the check), got {self.max_digits}")

    def resolve_token(self) -> str | None:
        """The bearer token to require, or None when auth is off.

        Raises ServiceConfigError when auth is on and no token is configured, or the token
        file is unusable (missing, unreadable, empty, or readable by group/others).
        """
        if not self.auth:
            return None
        if self.token:
            return self.token
        if self.token_file:
            return load_token_file(self.token_file)
        env_token = os.environ.get(TOKEN_ENV, "").strip()
        if env_token:
            return env_token
        raise ServiceConfigError(
            f"authentication is on but no token is configured: give --token-file FILE (mode 0600) "
            f"or set {TOKEN_ENV}, or pass --no-auth explicitly to run without authentication"
        )

