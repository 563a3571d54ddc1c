"""The slice shapes a provider offers a torus machine in (TPU pods), and how a device count is laid out on them.

A TPU pod is not rented by the chip: Cloud TPU creates slices of listed shapes (v5p: 2x2x1, 2x2x2 and 2x4x4
below one 4x4x4 cube) and, from one cube up, of whole cubes along every axis up to the largest slice
(v5p: 16x16x24); a job larger than a slice runs on several equal slices joined by the data-center network
(Multislice). docs/hardware.md, "Slice shapes", gives each preset's source.

``layout(slices, caps, devices)`` is the layout of ``devices`` chips on such a machine: the fewest equal
slices (the largest slice that divides the count), and among slices of that size the most nearly cubic shape
(the smallest sum of axes, as Cloud TPU's default shapes are: 512 chips = 8x8x8, 256 = 4x8x8), its axes
paired with the torus dimensions from the shortest to the longest. None where the count is no whole number of
equal slices; Cluster.dim_sizes then lays it out as a hypothetical machine would be, each dimension filled in
turn (the COMET studies ask about such machines), and ``plan`` does not offer it.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from comet_dse.base.errors import InputError


@dataclass(frozen=True)
class Slices:
    """Slice shapes: ``listed`` (each a tuple of chips per torus axis) and, where not None, every shape made of
    whole ``block``s (a tuple per axis, e.g. (4, 4, 4)) up to the torus dimensions' sizes."""

    listed: tuple = ()
    block: tuple | None = None

    def shapes(self, caps: tuple) -> list:
        """Every offered shape within ``caps`` (the torus dimensions' sizes), axes sorted; none where ``caps``
        is empty or of another number of axes (a network that replaced the torus)."""
        return list(_offered(self, tuple(caps)))

    def text(self) -> str:
        """The shapes in words, e.g. "2x2x1, 2x2x2, 2x4x4, or whole 4x4x4 blocks"."""
        words = [shape_text(s) for s in self.listed]
        if self.block is not None:
            words.append(f"whole {shape_text(self.block)} blocks")
        return ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]


@functools.lru_cache(maxsize=64)
def _offered(slices: Slices, caps: tuple) -> tuple:
    """``Slices.shapes``, computed once per (slices, caps): Cluster.dim_sizes asks for every layout."""
    if not caps:
        return ()
    out = set(tuple(sorted(s)) for s in slices.listed)
    if slices.block is not None:
        ranges = [range(b, max(caps) + 1, b) for b in slices.block]
        out.update(tuple(sorted(s)) for s in itertools.product(*ranges) if fits(s, caps))
    return tuple(sorted(s for s in out if fits(s, caps)))


def shape_text(shape) -> str:
    return "x".join(str(a) for a in shape)


def fits(shape, caps: tuple) -> bool:
    """Whether ``shape``'s axes can be given to dimensions of sizes ``caps``: shortest axis to smallest size."""
    return len(shape) == len(caps) and all(a <= c for a, c in zip(sorted(shape), sorted(caps)))


def on_dimensions(shape, caps: tuple) -> tuple:
    """``shape``'s axes in the order of the dimensions of sizes ``caps``: longest axis innermost where every axis
    then fits (dimensions fill innermost first, as Cluster.dim_sizes fills them), else the shortest axis to the
    smallest dimension."""
    longest_first = tuple(sorted(shape, reverse=True))
    if all(a <= c for a, c in zip(longest_first, caps)):
        return longest_first
    by_size = sorted(range(len(caps)), key=lambda i: (caps[i], i))
    out = [0] * len(caps)
    for axis, i in zip(sorted(shape), by_size):
        out[i] = axis
    return tuple(out)


def layout(slices: Slices, caps: tuple, outer: int | None, devices: int) -> tuple | None:
    """(axes on each torus dimension..., slices over the outer network) for ``devices`` chips, or None where
    ``devices`` is no whole number of equal offered slices. ``outer``: how many slices the outer network
    joins (None: as many as needed; 1 where there is no outer network)."""
    shapes = slices.shapes(caps)
    for chips in sorted({math.prod(s) for s in shapes}, reverse=True):
        count = devices // chips
        if devices % chips or (outer is not None and count > outer):
            continue
        best = min((s for s in shapes if math.prod(s) == chips), key=lambda s: (sum(s), max(s)))
        return on_dimensions(best, caps) + ((count,) if outer != 1 or count != 1 else ())
    return None


def nearest(slices: Slices, caps: tuple, outer: int | None, devices: int, largest: int | None) -> tuple:
    """(the largest laid-out count below ``devices``, the smallest above it), None where there is none; counts
    up to ``largest`` (max_devices) or twice ``devices``."""
    top = largest if largest is not None else 2 * devices
    below = next((n for n in range(min(devices, top), 0, -1) if layout(slices, caps, outer, n)), None)
    above = next((n for n in range(devices + 1, top + 1) if layout(slices, caps, outer, n)), None)
    return below, above


def parse_shape(text, axes: int, field: str) -> tuple:
    """A shape written "4x4x4" (or a list of integers) as a tuple of ``axes`` positive integers."""
    parts = text.lower().split("x") if isinstance(text, str) else text if isinstance(text, list) else []
    try:
        shape = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != axes or min(shape) < 1:
        raise InputError(field, f"{text!r} is not a shape of {axes} axes like {'x'.join(['4'] * axes)}")
    return shape


def slices_from(data: dict, caps: tuple, field: str) -> Slices:
    """The ``slices:`` block of a cluster file: ``shapes`` (listed) and ``block``, each shape with one axis per
    bounded network dimension, each fitting the dimensions' sizes ``caps``."""
    if not isinstance(data, dict) or not set(data) <= {"shapes", "block"} or not data:
        raise InputError(field, "must be a mapping of shapes: [2x2x1, ...] and/or block: 4x4x4")
    listed = data.get("shapes", [])
    if not isinstance(listed, list):
        raise InputError(f"{field}.shapes", "must be a list of shapes like 2x2x1")
    out = Slices(tuple(parse_shape(s, len(caps), f"{field}.shapes[{i}]") for i, s in enumerate(listed)),
                 parse_shape(data["block"], len(caps), f"{field}.block") if "block" in data else None)
    for i, s in enumerate(out.listed):
        if not fits(s, caps):
            raise InputError(f"{field}.shapes[{i}]", f"{shape_text(s)} does not fit the torus of "
                             f"{shape_text(caps)}")
    if not out.shapes(caps):
        raise InputError(field, f"no shape fits the torus of {shape_text(caps)}")
    return out
