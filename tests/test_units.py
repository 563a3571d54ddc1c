import pytest

from comet_dse.base.errors import InputError
from comet_dse.base.units import KIND_BANDWIDTH, KIND_BYTES, KIND_FLOPS, KIND_TIME, format_bytes, parse_quantity


@pytest.mark.parametrize("text,kind,expected", [
    ("80 GiB", KIND_BYTES, 80 * 2**30),
    ("40 MiB", KIND_BYTES, 40 * 2**20),
    ("16 GB", KIND_BYTES, 16e9),
    ("2.039 TB/s", KIND_BANDWIDTH, 2.039e12),
    ("200 Gb/s", KIND_BANDWIDTH, 25e9),
    ("312 TFLOP/s", KIND_FLOPS, 312e12),
    ("5 us", KIND_TIME, 5e-6),
    ("1.5 ms", KIND_TIME, 1.5e-3),
    (1e9, KIND_BYTES, 1e9),
])
def test_parse_quantity(text, kind, expected):
    assert parse_quantity(text, kind, "f") == pytest.approx(expected)


@pytest.mark.parametrize("text,kind", [
    ("80 GFLOP/s", KIND_BYTES),   # wrong kind of unit
    ("312 TiFLOP/s", KIND_FLOPS),  # binary prefix on FLOP/s is not allowed
    ("fast", KIND_BANDWIDTH),
    (True, KIND_TIME),
])
def test_parse_quantity_rejects(text, kind):
    with pytest.raises(InputError) as err:
        parse_quantity(text, kind, "accelerator.memory.hbm.bandwidth")
    assert err.value.field == "accelerator.memory.hbm.bandwidth"


def test_format_bytes_uses_binary_units():
    assert format_bytes(80 * 2**30) == "80.0 GiB"
    assert format_bytes(1536) == "1.5 KiB"
