"""Typed results as tables: ``to_arrow()`` (pyarrow, a dependency) and ``to_pandas()`` (pandas, optional)."""
from __future__ import annotations

from abc import ABC, abstractmethod


class Tabular(ABC):
    """A result that is a list of rows (``rows()``: one dict per row, plain values) and converts to tables.

    pyarrow is imported when a table is asked for, pandas only by ``to_pandas`` (``pip install pandas``).
    Each result type defines ``rows``; the conversions are shared.
    """

    @abstractmethod
    def rows(self) -> list:
        """One dict per row, plain values."""

    def to_arrow(self):
        """The rows as a ``pyarrow.Table``."""
        import pyarrow as pa

        return pa.Table.from_pylist(self.rows())

    def to_pandas(self):
        """The rows as a ``pandas.DataFrame`` (needs pandas: ``pip install 'comet-dse[pandas]'``)."""
        return arrow_to_pandas(self.to_arrow())


def arrow_to_pandas(table):
    """``table.to_pandas()``, or an ImportError that says how to install pandas."""
    try:
        import pandas  # noqa: F401 - only to check it is installed
    except ImportError:
        raise ImportError("to_pandas() needs pandas: pip install 'comet-dse[pandas]' (or pip install pandas); "
                          "to_arrow() works without it") from None
    return table.to_pandas()
