"""``comet-dse estimate``: one training iteration of one strategy, as text or JSON."""
from __future__ import annotations


from comet_dse.answers.overrides import add_override_options
from comet_dse.base import jsonout
from comet_dse.base.errors import InputError
from comet_dse.cli.options import (
    add_goodput_options, add_knob_options, add_model_inputs, add_tokens_option, load_inputs, strategy_from,
)

# Broken rules that make a command-line estimate an input error rather than a result.
SPLIT_RULES = {"ep_experts": "ep", "cp_seq": "cp", "attention_kernel": "attention-kernel", "rec_degrees": "tp",
               "column_split": "embedding-sharding"}


def add_parser(sub) -> None:
    p = sub.add_parser("estimate", help="estimate one training iteration")
    add_model_inputs(p)
    add_knob_options(p, many=False)
    add_override_options(p)
    add_tokens_option(p)
    add_goodput_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (SI units)")


def run(args) -> int:
    from comet_dse.answers.estimate import estimate
    from comet_dse.cli.render import attention_note, render_estimate
    from comet_dse.strategy.declared import runs_fused_attention, with_listed_kernel
    from comet_dse.workload.families import family_of

    model, cluster = load_inputs(args)
    cluster.dim_sizes(args.devices)
    from comet_dse.api import with_band

    strategy = with_listed_kernel(strategy_from(args, args.devices), cluster.accelerator,
                                  args.attention_kernel is not None)
    result = with_band(estimate(model, cluster, args.devices, strategy, tokens=args.tokens), cluster, model)
    reasons = dict(zip(result.broken_rules, result.reasons))   # the two lists run in rule order
    for code, field in SPLIT_RULES.items():
        if code in reasons:
            raise InputError(field, reasons[code])
    if args.json:
        print(jsonout.dumps(result.to_dict(), indent=2))
    else:
        note = attention_note(cluster.accelerator, runs_fused_attention(strategy.to_dict()))
        if note:
            print(note)
        exp = cluster.accelerator.expansion
        print(render_estimate(result, cluster.accelerator.state_capacity, exp.capacity if exp else None,
                              model.tied_embeddings, family_of(model)))
    return 0
