"""Design-space exploration: enumerate strategies and cluster variants, evaluate in bulk, rank."""
