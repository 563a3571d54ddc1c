"""``comet-dse explore``: a live design-space explorer in the browser (docs/explore-ui.md).

view.py computes what the page shows from its controls with the batched cost model (no Dash needed);
figures.py turns that into Plotly figure specifications (plain dicts); app.py is the Dash page and
serve.py serves it. Only app.py and serve.py need the optional extra: ``pip install 'comet-dse[explore]'``.
"""
