"""The one exception type for bad user input."""
from __future__ import annotations


class InputError(ValueError):
    """Bad input: names the offending field and what would be valid.

    The CLI prints ``str(error)`` as one line on stderr and exits with status 2.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
