"""The one error type the CLI turns into a single clear line and a non-zero exit."""


class RlrunError(Exception):
    """A user-facing failure: the message says what was wrong and what was expected."""

    exit_code = 1
