"""The services' bearer token: read by a service from its file, by a client from its environment.

A service reads its token from a file that only its user may read (:func:`load_token_file`, its
``--token-file``); a client in the Ray job takes ``$<VALUE_ENV>``, else the file ``$<FILE_ENV>`` names
(each rlrun node exports the path of its copy: :func:`token_from_env`). Never from a command line, which
``ps`` shows.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from trainer.services.cli import ServiceConfigError

__all__ = ["load_token_file", "token_from_env"]


def load_token_file(path: str) -> str:
    """Read a bearer token from ``path`` (content stripped), refusing group/world-accessible files."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ServiceConfigError(f"--token-file {path}: no such file") from None
    except OSError as exc:
        raise ServiceConfigError(f"--token-file {path}: cannot stat: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ServiceConfigError(f"--token-file {path}: not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ServiceConfigError(
            f"--token-file {path} is accessible by group/others (mode {mode:04o}); "
            f"expected mode 0600 or 0400: run chmod 600 {path}"
        )
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise ServiceConfigError(f"--token-file {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ServiceConfigError(f"--token-file {path}: not UTF-8 text") from None
    if not token:
        raise ServiceConfigError(f"--token-file {path} is empty; expected the bearer token on one line")
    return token


def token_from_env(what: str, value_env: str, file_env: str, error: type[Exception],
                   environ: Mapping[str, str] | None = None) -> str | None:
    """A client's bearer token for the ``what`` service: ``$VALUE_ENV``, else the content of the file
    ``$FILE_ENV`` (each rlrun node exports the path of its copy), else None. An unreadable or empty file
    raises ``error`` naming it."""
    env = os.environ if environ is None else environ
    if env.get(value_env, "").strip():
        return env[value_env].strip()
    path = env.get(file_env)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise error(f"cannot read the {what} token file ${file_env}={path}: {exc.strerror}") from None
    if not token:
        raise error(f"the {what} token file ${file_env}={path} is empty")
    return token
