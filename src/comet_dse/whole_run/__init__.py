"""A whole training run from one step: time to train, goodput, energy and cost of a token budget."""
