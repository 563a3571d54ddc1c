"""The positive divisors of an integer: what the degrees of a parallel split and micro-batch sizes are drawn from."""
from __future__ import annotations

import functools
import math


def divisors(n: int) -> list:
    """Positive divisors of n, ascending (sqrt(n) steps, remembered: a search asks for the divisors of the
    same batch per replica once per degree split)."""
    return list(_divisors(int(n)))


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))
