"""``comet-dse presets``: the built-in models and clusters."""
from __future__ import annotations

from comet_dse.base import jsonout


def add_parser(sub) -> None:
    p = sub.add_parser("presets", help="list the built-in models and clusters")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    from comet_dse.base.text import render_table
    from comet_dse.base.vocabulary import BANDWIDTH_CONVENTION, resource
    from comet_dse.cli.render import describe_peak, render_network
    from comet_dse.presets.catalog import load_cluster, load_model, preset_names

    from comet_dse.model.recommendation import Recommendation

    loaded = [load_model(n) for n in preset_names("models")]
    models = [m for m in loaded if not isinstance(m, Recommendation)]
    recommenders = [m for m in loaded if isinstance(m, Recommendation)]
    clusters = [load_cluster(n) for n in preset_names("clusters")]
    if args.json:
        print(jsonout.dumps({
            "models": [{"name": m.name, "family": "transformer", "params": m.total_params(), "layers": m.layers,
                        "hidden": m.hidden, "description": m.description, "source": m.source} for m in models]
            + [{"name": m.name, "family": "recommendation", "params": m.total_params(), "tables": len(m.tables),
                "embedding_bytes": m.embedding_bytes(), "description": m.description, "source": m.source}
               for m in recommenders],
            "clusters": [{"name": c.name, "device": c.accelerator.name, "description": c.description,
                          "source": c.source} for c in clusters],
        }, indent=2))
        return 0
    rows = [[m.name, f"{m.total_params() / 1e9:.1f}B", m.layers, m.hidden, m.attention.heads,
             m.attention.kv_heads, m.mlp.ffn, m.mlp.kind.value, m.seq_len, m.description] for m in models]
    print("Models")
    print(render_table(["name", "params", "layers", "hidden", "heads", "kv", "ffn", "mlp", "seq", "description"], rows,
                       left=(0, 7, 9)))
    rows = [[m.name, f"{m.total_params() / 1e9:.1f}B", len(m.tables), resource("hbm_capacity").text(m.embedding_bytes()),
             m.dim, f"{sum(t.pooling for t in m.tables):g}", m.interaction.value, m.description] for m in recommenders]
    print("\nRecommendation models (family: recommendation)")
    print(render_table(["name", "params", "tables", "tables' bytes", "dim", "lookups/sample", "interaction",
                        "description"], rows, left=(0, 6, 7)))
    rows = [[c.name, c.accelerator.name, describe_peak(c.accelerator.peak_flops),
             *(resource(name).text(value) for name, value in (("hbm_capacity", c.accelerator.hbm.capacity),
                                                              ("hbm_bandwidth", c.accelerator.hbm.bandwidth),
                                                              ("sram_capacity", c.accelerator.sram.capacity))),
             render_network(c)] for c in clusters]
    print("\nClusters")
    print(render_table(["name", "device", "peak", "HBM", "HBM bw", "SRAM", "network (innermost first)"], rows,
                       left=(0, 1, 6)))
    print(BANDWIDTH_CONVENTION)
    return 0
