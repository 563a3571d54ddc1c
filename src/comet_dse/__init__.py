"""comet-dse: an analytical model of distributed LLM training and a cluster design-space explorer."""

__version__ = "0.1.0"
