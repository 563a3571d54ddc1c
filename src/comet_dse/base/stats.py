"""The error statistics of predictions against measurements, computed once.

``validate``'s tables, its memory line and the error bands (answers/errorband.py) all summarise signed relative
errors, (predicted - measured) / measured, with the figures here.
"""
from __future__ import annotations

KEYS = ("mean_abs_error", "max_abs_error", "mean_error", "low", "high")


def error_stats(errors) -> dict:
    """{mean_abs_error, max_abs_error, mean_error, low, high} of signed relative errors (fractions): the mean
    and the largest |error|, the signed mean, and the most negative and most positive error; each None when
    there are no errors. Sums run in order, left to right."""
    errors = list(errors)
    if not errors:
        return dict.fromkeys(KEYS)
    n = len(errors)
    return {"mean_abs_error": sum(abs(e) for e in errors) / n, "max_abs_error": max(abs(e) for e in errors),
            "mean_error": sum(errors) / n, "low": min(errors), "high": max(errors)}


def error_cell(errors) -> str:
    """Signed relative errors (fractions) as a validation table's cell: mean |error| and, in brackets, the mean
    signed error, both in per cent: "10.0 % (-8.9)"."""
    errors = list(errors)
    mean_abs = sum(abs(e) for e in errors) / len(errors)
    return f"{mean_abs * 100:.1f} % ({sum(errors) / len(errors) * 100:+.1f})"
