"""The names of what comet-dse reports, defined once: the parts of a step's time and of a device's memory.

Every output that labels these quantities (the terminal text, JSON keys, figures, the explorer and the
report) reads them from here.
"""
from __future__ import annotations

BREAKDOWN_LABELS = {
    "compute": "compute-bound kernels",
    "memory": "memory-bound kernels",
    "tp_communication": "tensor-parallel comm (exposed)",
    "cp_communication": "context-parallel K/V (exposed)",
    "ep_communication": "expert all-to-all (exposed)",
    "pp_communication": "pipeline send/recv",
    "pipeline_bubble": "pipeline bubble (idle)",
    "dp_communication": "data-parallel comm (exposed)",
    "optimizer": "optimizer step",
    "offload": "expansion-tier traffic",
    "overhead": "fixed framework overhead",
}
MEMORY_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations",
    "buffers": "communication buffers",
}
