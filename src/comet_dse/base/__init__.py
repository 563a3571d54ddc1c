"""Foundations every part uses: errors, units, bounds, names, text, tables, safe reading and writing."""
