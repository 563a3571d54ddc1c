"""How a training step is parallelised and executed: every strategy knob, declared once.

choices.py the named choices (Enums); knob.py what a knob is and how one is declared; declared.py the Strategy
with its knobs (KNOBS) and the rules between them; arrays.py many strategies as arrays (StrategyArrays); base/text.py a
strategy in words (text lines, compact codes, their legend). docs/knobs.md says how to add a knob.
"""
