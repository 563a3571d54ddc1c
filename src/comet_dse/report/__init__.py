"""Reports: figures and a self-contained HTML page from study results."""
