"""The version of comet-dse (one place: the package, reports and sweep fingerprints read it)."""

__version__ = "0.1.0"
