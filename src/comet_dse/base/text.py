"""Plain text for a terminal: names made safe to print, and aligned tables.

Every command's text output goes through these two, so a name read from a file never moves the cursor
and every table lines up the same way.
"""
from __future__ import annotations

import re
import unicodedata

# C0 and C1 control characters (ESC starts terminal escape sequences) and DEL; newline and tab stay.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# Invisible characters that change how the text around them is shown (Unicode categories Cf, Zl, Zp):
# bidirectional overrides (U+202E makes 'evil\u202etxt.exe' read 'evilexe.txt'), zero-width spaces and joiners
# (U+200B makes two ids that print alike differ), the byte-order mark, line and paragraph separators.
_HIDDEN_CATEGORIES = ("Cf", "Zl", "Zp")


def printable(text: str) -> str:
    """``text`` without terminal control characters (a name from a file cannot move the cursor, recolour or
    retitle the terminal), and with every invisible format character written as its escape (``\u202e``):
    a run id cannot be shown reversed, or look like another one."""
    text = _CONTROL.sub("", str(text))
    if text.isascii():
        return text
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in _HIDDEN_CATEGORIES else c for c in text)


def render_table(headers: list, rows: list, left: tuple = (0,)) -> str:
    """A text table: columns in ``left`` left-aligned (text), the others right-aligned (numbers)."""
    headers = [printable(h) for h in headers]
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max([len(str(h))] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]

    def fmt(cells):
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return printable("\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]))


def markdown_table(headers: list, rows: list) -> str:
    """A Markdown table: a header row, a separator of ``---`` cells and one row per list of cells."""
    lines = [headers, ["---"] * len(headers)] + [[str(c) for c in r] for r in rows]
    return printable("\n".join("| " + " | ".join(cells) + " |" for cells in lines))
