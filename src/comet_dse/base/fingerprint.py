"""A fingerprint of a mapping read from a file: what a written file records to tell later whether it was edited.

    fingerprint(data, drop) = sha256(canonical JSON of ``data`` without the keys in ``drop``)

Canonical JSON: keys sorted, no spaces, floats as Python writes them (their shortest repr, which a YAML
round trip keeps), NaN refused (base/jsonout.py). Used by the efficiency file (hardware/efficiency.py) and by
calibrated cluster files (hardware/load.py, answers/calibrate.py).
"""
from __future__ import annotations

import copy
import hashlib

from comet_dse.base import jsonout


def fingerprint(data: dict, drop: tuple = ()) -> str:
    """sha256 (hex) of ``data`` as canonical JSON, without each dotted key of ``drop`` ("calibration.fingerprint")."""
    body = copy.deepcopy(data)
    for dotted in drop:
        *parents, last = dotted.split(".")
        node = body
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return hashlib.sha256(jsonout.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
