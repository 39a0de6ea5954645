"""The one exception type a user is meant to see.

Anything raised as ClbenchError is bad input or an unavailable resource: the CLI prints its
message on one line and exits non-zero. Everything else is a bug and keeps its traceback.
"""


class ClbenchError(Exception):
    pass


class DivergedError(ClbenchError):
    """Training produced a non-finite loss or gradient; the run is recorded as failed."""


def first_line(error: Exception) -> str:
    """An exception's message cut to one line, as a ClbenchError wrapping it is printed."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
