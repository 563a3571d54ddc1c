"""Handing one estimate to a simulator: Chakra execution traces and ASTRA-sim inputs (docs/export.md)."""
