"""``comet-dse estimate``: one training iteration of one strategy, as text or JSON."""
from __future__ import annotations


from comet_dse import jsonout
from comet_dse.cli.options import (add_knob_options, add_model_inputs, add_goodput_options, add_tokens_option, load_inputs,
                                   strategy_from)
from comet_dse.errors import InputError
from comet_dse.overrides import add_override_options

# Broken rules that make a command-line estimate an input error rather than a result.
SPLIT_RULES = {"ep_experts": "ep", "cp_seq": "cp", "attention_kernel": "attention-kernel"}


def add_parser(sub) -> None:
    p = sub.add_parser("estimate", help="estimate one training iteration")
    add_model_inputs(p)
    add_knob_options(p, many=False)
    add_override_options(p)
    add_tokens_option(p)
    add_goodput_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (SI units)")


def run(args) -> int:
    from comet_dse.cli.render import attention_note, render_estimate
    from comet_dse.estimate import estimate

    model, cluster = load_inputs(args)
    cluster.dim_sizes(args.devices)
    from comet_dse.api import with_band

    strategy = listed_kernel(strategy_from(args, args.devices), args, cluster.accelerator)
    result = with_band(estimate(model, cluster, args.devices, strategy, tokens=args.tokens), cluster, model)
    reasons = dict(zip(result.broken_rules, result.reasons))   # the two lists run in rule order
    for code, field in SPLIT_RULES.items():
        if code in reasons:
            raise InputError(field, reasons[code])
    if args.json:
        print(jsonout.dumps(result.to_dict(), indent=2))
    else:
        note = attention_note(cluster.accelerator, (strategy.flash_attention,))
        if note:
            print(note)
        exp = cluster.accelerator.expansion
        print(render_estimate(result, cluster.accelerator.state_capacity, exp.capacity if exp else None,
                              model.tied_embeddings))
    return 0


def listed_kernel(strategy, args, accelerator):
    """With flash attention and no --attention-kernel, the kernel a search would run on this accelerator: the
    knob's default (fa2) where the accelerator lists it, else the first kernel it lists (fa4 on Blackwell),
    instead of an error naming a kernel the user did not ask for."""
    from dataclasses import replace

    from comet_dse.strategy import KNOB, AttentionKernel

    if not strategy.flash_attention or args.attention_kernel is not None:
        return strategy
    listed = KNOB["attention_kernel"].cluster_default([accelerator])
    return replace(strategy, attention_kernel=AttentionKernel(listed[0])) if listed else strategy
