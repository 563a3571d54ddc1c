"""Step 6, the step's other terms: traffic to and work on an expansion memory tier (CXL, host memory).

What spills from HBM (cost/memory.py: place) is streamed from the tier every pass; ``offload_time`` charges
what is not hidden: all of it, the excess over each pass's compute (prefetched, ZeRO-Infinity), or COMET's
remote-memory roofline with the tier's optional compute roof (``remote_compute_per_pass``). docs/model.md,
"Expansion tier".
"""
from __future__ import annotations

import numpy as np

from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays


def remote_per_pass(acc, placed, memory, act_per_mb) -> tuple:
    """Seconds per micro-batch the forward and the backward pass stream from the expansion tier: (W_x + f_x A)
    / B and (2 W_x + f_x A) / B (``offload_time``'s terms; W_x the spilled weights and gradients, f_x A the
    spilled share of a micro-batch's activations, B the tier's achievable bandwidth)."""
    bw = acc.expansion.achievable_bandwidth
    act_total = np.maximum(memory["activations"], 1.0)
    act_fraction = np.where(memory["activations"] > 0, placed.spilled_activations / act_total, 0.0)
    spilled_act = act_fraction * act_per_mb
    return (placed.spilled_weights + spilled_act) / bw, (2.0 * placed.spilled_weights + spilled_act) / bw


def stage_pass_flops(model: Transformer, st: StrategyArrays, stage_layers, m, flops: tuple) -> tuple:
    """Hardware FLOP one device of the fullest stage runs per micro-batch in forward and in backward (with its
    recomputation): of the step's (F, H) = ``flops`` (``step_flops``: model and hardware FLOP; backward is twice
    forward) the shares F/3 and H - F/3, times the device's part of them,
        n_stage / (L tp cp dp m)
    (n_stage the stage's transformer layers of L; a stage's embedding and head taken in proportion to its
    layers)."""
    model_f, hardware_f = flops
    share = np.maximum(stage_layers, 1.0) / (model.layers * st.tp * st.cp * st.dp * m)
    return model_f / 3.0 * share, (hardware_f - model_f / 3.0) * share


def remote_compute_per_pass(peak, placed, memory, pass_flops) -> tuple:
    """Seconds per micro-batch the forward and the backward pass compute on operands read from the expansion
    tier in place, at the tier's compute roof P_x (MemoryTier.compute; the COMET authors' remote-memory
    roofline, trial/run.log: remote-mem-roofline-peak-perf 10000 GFLOP/s beside remote-mem-roofline-bw):
        forward  s_w F_f / P_x            (its GEMMs read the spilled weights)
        backward max(s_w, f_x) F_b / P_x  (it reads weights and saved activations and writes gradients)
    s_w = W_x / (W + G): the spilled share of the weights and gradients; f_x the spilled share of the
    activations; F_f, F_b the pass's FLOP (``stage_pass_flops``). Spilled bytes are taken as the same share of
    every layer, and the two kinds on the same layers, so that the fewest operators touch the tier: a lower
    bound of the capped work. The optimizer's work on spilled state is left out: about 16 FLOP per 24 bytes
    streamed (read and write of fp32 master, m, v), under the roof's ridge P_x / B (100 FLOP/B in the
    authors' configs), so the stream ``offload_time`` charges bounds it."""
    f_fwd, f_bwd = pass_flops
    wg = memory["weights"] + memory["gradients"]
    weights_share = np.where(wg > 0, placed.spilled_weights / np.maximum(wg, 1.0), 0.0)
    act_share = np.where(memory["activations"] > 0,
                         placed.spilled_activations / np.maximum(memory["activations"], 1.0), 0.0)
    return weights_share * f_fwd / peak, np.maximum(weights_share, act_share) * f_bwd / peak


def offload_time(acc, placed, memory, act_per_mb, m, overlap=None, roofline=None):
    """Traffic to the expansion tier per step that is not hidden behind compute [s].

    Spilled bytes (cost/memory.py: place): O_x of optimizer state, W_x of
    weights and gradients, and the share f_x of each micro-batch's A
    activation bytes. Per step the optimizer state is read and written once
    (2 O_x); per micro-batch the weights are read in forward and again in
    backward and the gradients written in backward (3 W_x: W_x forward, 2 W_x
    backward), the spilled activations written in forward and read in
    backward (f_x A each). B: the tier's achievable bandwidth; one access
    latency per transfer phase (2 per step for the optimizer, 3 per
    micro-batch otherwise).
    Without overlap (default) all of it is exposed:
        T = (2 O_x + m (3 W_x + 2 f_x A)) / B + latencies
    ``overlap`` = (expansion_overlap per point, T_f, T_b, T_opt, T_dp): where
    on, each pass's traffic is prefetched (weights and the activations read
    back) or drained (gradients, activations written) while that pass
    computes, as ZeRO-Infinity's prefetching offload engine and CXL memory
    pooling do, and only the excess is exposed (a roofline per pass):
        E = m [max(0, (W_x + f_x A)/B - T_f) + max(0, (2 W_x + f_x A)/B - T_b)]
            + max(0, 2 O_x / B - T_opt)
    The tier's link is not the network's, so its transfers also proceed while
    the device waits on exposed data-parallel communication T_dp; only what
    is left after that is charged:
        T = max(0, E - T_dp) + latencies
    Without this, the excess over the same compute window would be charged
    twice (once as exposed DP communication, once as exposed tier traffic), and
    a faster device could make the step slower. With it, the overlapped part of
    the step is max(compute, DP, tier) per window: never longer when compute,
    HBM or a link gets faster.
    T_f, T_b: the stage's forward and backward (+ recomputation) seconds per
    micro-batch with their exposed communication; T_opt: the optimizer step;
    T_dp: the step's exposed data-parallel communication.
    ``roofline`` = (expansion_roofline per point, C_f, C_b, R_f, R_b, F): where on, the tier is costed as
    COMET's remote-memory roofline (dkadiyala3/comet-astrasim, trial/run.log: remote-mem-roofline-bw and
    -peak-perf beside local-mem-roofline-*): an operator takes max(compute, local memory, remote memory,
    compute on remote operands), so each pass's remote time R (its stream (W_x + f_x A)/B, (2 W_x + f_x A)/B,
    or where the tier has a compute roof its work on spilled operands at that roof, whichever is longer:
    ``remote_compute_per_pass``) hides only behind that pass's own duration C_f, C_b (T_f, T_b: its kernels,
    compute- or memory-bound, and the in-layer communication they wait on), and nothing is prefetched from
    one pass into another or into exposed DP time. (Hiding it behind the compute-bound kernels alone made
    faster compute slow a step: a GEMM that turns memory-bound, or attention that stops hiding a CP ring,
    left that window, issue 32.)
        T = (m + F) [max(0, R_f - C_f) + max(0, R_b - C_b)] + max(0, 2 O_x / B - T_opt) + latencies
    (the optimizer, memory-bound, streams its spilled state beside its HBM traffic). F = (p - 1) / v: the
    pipeline's fill and drain run the same stretched passes, so its bubble grows by F of them. (Without it a
    higher compute roof or a faster tier could slow a step: the data-parallel reduction hides behind
    ((v - 1) p + 1) / v passes, more than the m a step was charged for.)
    Sources: Rajbhandari et al. 2021 (ZeRO-Infinity, arXiv:2104.07857,
    Sec. 6: overlap-centric design); docs/model.md.
    """
    if acc.expansion is None:
        return np.zeros_like(placed.hbm)
    bw, lat = acc.expansion.achievable_bandwidth, acc.expansion.latency
    remote_f, remote_b = remote_per_pass(acc, placed, memory, act_per_mb)
    phases = (np.where(placed.spilled_optimizer > 0, 2.0, 0.0)
              + np.where(placed.expansion > placed.spilled_optimizer, 3.0 * m, 0.0))
    exposed = 2.0 * placed.spilled_optimizer / bw + m * (remote_f + remote_b)
    if overlap is not None:
        on, t_f, t_b, t_opt, t_dp = overlap
        forward = np.maximum(remote_f - t_f, 0.0)
        backward = np.maximum(remote_b - t_b, 0.0)
        optimizer = np.maximum(2.0 * placed.spilled_optimizer / bw - t_opt, 0.0)
        exposed = np.where(on, np.maximum(m * (forward + backward) + optimizer - t_dp, 0.0), exposed)
        if roofline is not None:
            on, c_f, c_b, roof_f, roof_b, fill = roofline
            forward = np.maximum(roof_f - c_f, 0.0)
            backward = np.maximum(roof_b - c_b, 0.0)
            exposed = np.where(on, (m + fill) * (forward + backward) + optimizer, exposed)
    return exposed + phases * lat


def host_offload_time(acc, moved, m, fwd, bwd):
    """Exposed seconds per step of the activations that wait in host memory (activation_offload):
        m [max(0, a / B_h - T_f) + max(0, a / B_h - T_b)]
    a = o A: the offloaded share of a micro-batch's kept activations [bytes], copied to the host beside each
    forward and back beside each backward (copy engines, as Megatron-Core's and MaxText's offloading run them);
    B_h the host link's achievable bandwidth per device (accelerator.memory.host: bandwidth x efficiency);
    T_f, T_b the pass's compute [s]. Without a host tier the point does not fit (cost/step.py) and nothing moves;
    a point that offloads nothing costs exactly 0, whatever its passes (NaN where it breaks a rule), as it does
    in a batch where no point offloads.
    """
    moved = np.asarray(moved, dtype=float)
    if acc.host is None or not acc.host.achievable_bandwidth > 0:
        return np.zeros_like(moved)
    copy = moved / acc.host.achievable_bandwidth
    return np.where(moved > 0, m * (np.maximum(copy - fwd, 0.0) + np.maximum(copy - bwd, 0.0)), 0.0)
