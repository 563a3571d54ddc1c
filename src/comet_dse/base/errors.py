"""The exception types: InputError for bad user input, RunFailed for a run the machine stopped, StorageError
for a result the operating system would not store."""
from __future__ import annotations

import errno


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


class StorageError(OSError):
    """The operating system refused to store a result (no space left, a read-only file system, no
    permission, a quota): not the input's fault, and not a failed run. Names the field, what was being done
    and the path, and the cause with its symbolic errno; the CLI prints ``str(error)`` as one line and exits
    with status 74 (EX_IOERR of sysexits.h; cli/entry.py)."""

    def __init__(self, field: str, action: str, path, cause: OSError):
        code = cause.errno
        reason = cause.strerror or str(cause)
        symbol = errno.errorcode.get(code) if code is not None else None
        super().__init__(code, reason, str(path))
        self.field = field
        self.message = f"cannot {action} {path}: {reason}" + (f" ({symbol})" if symbol else "")

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"
