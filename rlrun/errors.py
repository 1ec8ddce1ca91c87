"""The one error type the CLI turns into a single clear line and a non-zero exit, and the translation of
everything else that can escape a command (vault, timeouts, files) into such a line."""

from __future__ import annotations

import os

import requests

VAULT_HINT = ("the inventory holds vault-encrypted values: pass --vault-password-file FILE (or set "
              "ANSIBLE_VAULT_PASSWORD_FILE), as for ansible-playbook")


VAULT_MARKERS = ("vault secrets", "Decryption failed", "undecryptable", "VaultSecretsContext")


def vault_message(password_file: str | None) -> str:
    """What to do about a vaulted value that could not be opened."""
    if password_file:
        return (f"the vault password in {password_file} does not open the inventory's vault-encrypted values "
                "(another password, or another --vault-id?)")
    return VAULT_HINT


class RlrunError(Exception):
    """A user-facing failure: the message says what was wrong and what was expected."""

    exit_code = 1


def is_vault_error(exc: BaseException) -> bool:
    """A vaulted value met without (or with the wrong) password, however deep Ansible raised it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__
        text = str(exc)
        if name == "AnsibleVaultError" or any(m in text for m in VAULT_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def command_error(exc: BaseException) -> str:
    """The message for an exception that escaped a command: what happened and what to do, one line
    (no traceback; RLRUN_TRACEBACK=1 shows it)."""
    if is_vault_error(exc):
        return vault_message(os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE"))
    if isinstance(exc, requests.Timeout):
        return f"no answer from the cluster in time ({exc})"
    if isinstance(exc, requests.ConnectionError):
        return f"cannot reach the cluster: {exc}"
    if isinstance(exc, PermissionError | FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror}"
    text = " ".join(str(exc).split()) or "(no message)"
    return (f"unexpected {type(exc).__name__}: {text[:500]} (a bug in rlrun; RLRUN_TRACEBACK=1 shows where, "
            "please report it)")
