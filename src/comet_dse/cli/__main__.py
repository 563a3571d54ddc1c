"""``python -m comet_dse.cli``: the same as the ``comet-dse`` command."""
from comet_dse.cli.entry import main

raise SystemExit(main())
