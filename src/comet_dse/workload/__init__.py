"""Workload families: what a kind of model (the decoder-only transformer; next, recommendation models) gives the
cost kernel and the search engine, so that a new family plugs in beside the first without branches through
cost/ or design_space/ (docs/architecture.md, "The workload seam")."""
