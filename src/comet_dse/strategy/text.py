"""A strategy in words: the strategy lines of the text output, the compact one-line code of tables
('tp8 pp64 dp8 mb1 v1 selective sp z1') and the legend of its words, all derived from the knob declarations."""
from __future__ import annotations

import functools

from comet_dse.base.vocabulary import NUMBER_MARK, legend_line
from comet_dse.strategy.choices import ZERO_SHARDS, Zero
from comet_dse.strategy.declared import KNOB, KNOBS, Strategy
from comet_dse.strategy.knob import ALWAYS, CHANGED, GIVEN, Knob


def knob_lines(values: dict) -> list:
    """The strategy's lines of the text output: its knobs, grouped by ``Knob.line``, as lists of labels.

    ``values``: knob name -> value (a Strategy's ``to_dict()`` or a result row).
    A knob is shown when it applies and, unless it is shown ALWAYS, differs from its default.
    """
    st = Strategy(**{k: v for k, v in values.items() if k in KNOB})
    lines = [[] for _ in range(1 + max(k.line for k in KNOBS))]
    for k in KNOBS:
        value = getattr(st, k.name)
        if k.applies is not None and not k.applies(st):
            continue
        if k.shown == ALWAYS or value != k.default:
            lines[k.line].append(k.label(value))
    return lines


def compact_text(values: dict, only: tuple | None = None) -> str:
    """One short line for a strategy in tables, e.g. 'tp8 pp64 dp8 mb1 v1 selective sp z1'.

    Degrees and the choices shown ALWAYS, then every other knob that differs
    from its default (a switch by its short name, 'no-' when turned off); the
    global batch (one per search) is left out. ``only``: the knobs a workload family's strategies vary
    (a recommendation model's: dp, the embedding knobs and dtype); None: every knob.
    """
    st = Strategy(**{k: v for k, v in values.items() if k in KNOB})
    words = []
    for k in KNOBS:
        value = getattr(st, k.name)
        if k.search == GIVEN or (k.applies is not None and not k.applies(st)) or (only and k.name not in only):
            continue
        if value == k.default and (k.shown == CHANGED or k.kind is bool) and not (only and k.name in ("dp", "dtype")):
            continue
        if k.kind is bool:
            words.append(k.short if value else f"no-{k.short}")
        elif k.kind is Zero:
            words.append(f"z{int(value)}")
        elif k.is_choice:
            words.append(value.value)
        else:
            words.append(f"{k.short}{value:g}" if k.kind is float else f"{k.short}{value}")
    return " ".join(words)


def _choice_meaning(k: Knob, value) -> str:
    """What a choice's word means in a compact strategy line: the words the strategy lines of the text
    output use for it (its label, e.g. 'CP by ring'), or where that is the bare value, the knob's meaning
    and the value ('training precision: bf16')."""
    if k.kind is Zero:
        return f"ZeRO stage {int(value)}: {ZERO_SHARDS[value]}"
    label = k.label(value)
    return f"{k.meaning}: {value.value}" if label == value.value else label


@functools.lru_cache(maxsize=1)
def legend_entries() -> tuple:
    """Every word ``compact_text`` can print, as (code, meaning), in the order of KNOBS: a count as its
    short name and N ('tpN'), a switch by the word it prints when it differs from its default, a choice
    by each value it can print. Derived from the knob declarations: a new knob has its entries."""
    out = []
    for k in KNOBS:
        if k.search == GIVEN:
            continue
        if k.kind is bool:
            out.append((f"no-{k.short}", k.label(False)) if k.default else (k.short, k.meaning))
        elif k.is_choice:
            out += [(_word(k, v), _choice_meaning(k, v)) for v in k.kind if k.shown == ALWAYS or v != k.default]
        else:
            out.append((f"{k.short}{NUMBER_MARK}", k.meaning))
    return tuple(out)


def _word(k: Knob, value) -> str:
    """The word ``compact_text`` prints for a choice's value."""
    return f"z{int(value)}" if k.kind is Zero else value.value


def legend_code(word: str) -> str | None:
    """The legend code a word of a compact strategy line belongs to ('tp8' -> 'tpN', 'sp' -> 'sp'), or None."""
    codes = dict(legend_entries())
    if word in codes:
        return word
    for k in sorted((k for k in KNOBS if k.search != GIVEN and not k.is_choice and k.kind is not bool),
                    key=lambda k: -len(k.short)):
        code = f"{k.short}{NUMBER_MARK}"
        if word.startswith(k.short) and code in codes and _is_number(word[len(k.short):]):
            return code
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return bool(text)


def legend(texts) -> str:
    """One legend line for the words of the compact strategy lines ``texts`` (those that appear, in the
    order of KNOBS); the empty string when there are none."""
    used = {legend_code(w) for text in texts if text for w in str(text).split()}
    entries = [(code, meaning) for code, meaning in legend_entries() if code in used]
    return legend_line(entries) if entries else ""
