"""comet-dse: an analytical model of distributed LLM training and a cluster design-space explorer.

The Python API (docs/api.md)::

    from comet_dse import estimate, search, whatif, plan, sweep, load_model, load_cluster

Importing the package loads the cost model (numpy, PyYAML) and nothing else; pyarrow and pandas are
imported when a result is turned into a table.
"""

from comet_dse.version import __version__

# The package root holds only its front (docs/architecture.md): these names are the API's functions and types;
# the modules behind them live in their parts (comet_dse.answers.estimate, comet_dse.answers.whatif, ...).
from comet_dse.api import (
    Estimate, InputError, SearchResults, SearchSpace, Strategy, SweepResults, WhatIf, estimate, load_cluster,
    load_model, plan, search, sweep, whatif,
)

__all__ = ["estimate", "search", "whatif", "plan", "sweep", "load_model", "load_cluster", "Estimate", "SearchResults",
           "SweepResults", "WhatIf", "Strategy", "SearchSpace", "InputError", "__version__"]
