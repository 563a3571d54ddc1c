"""The exception types: InputError for bad user input, RunFailed for a run the machine stopped."""
from __future__ import annotations


class InputError(ValueError):
    """Bad input: names the offending field and what would be valid.

    The CLI prints ``str(error)`` as one line on stderr and exits with status 2.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class RunFailed(OSError):
    """The machine, not the input, stopped a run (a worker process killed, out of memory). An OSError, so
    that the CLI prints it as one line with exit status 1 (cli/entry.py); the message says how to go on."""
