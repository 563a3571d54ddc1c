"""A bound for a hang in tests: fail instead of waiting forever, never a speed assertion."""
import contextlib
import signal

import pytest


@contextlib.contextmanager
def no_hang(seconds: int = 120):
    """Fail the test, instead of hanging it, if the block runs past ``seconds`` (SIGALRM; where there is
    none, the block just runs). A bound for a hang, far above the normal time on a loaded machine: the
    tests assert no speed (docs/reliability.md), they assert that the work is bounded before it starts."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def expired(signum, frame):
        pytest.fail(f"still running after {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
