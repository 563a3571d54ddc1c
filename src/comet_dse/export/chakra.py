"""TraceNodes (schedule.py) as Chakra ET bytes, with the attributes ASTRA-sim's workload layer reads.

Attribute names and types as Chakra's feeder (src/feeder/et_feeder_node.cpp) and converters
(src/converter/pytorch_converter.py, src/generator/generator.py) write and read them:
is_cpu_op bool; num_ops int64 (FLOP); tensor_size uint64 (bytes); comm_type int64 (CollectiveCommType);
comm_size int64 (bytes); pg_name string (a communicator group id of the --comm-group-configuration file);
comm_src, comm_dst, comm_tag int32. comet-dse adds comet_dse_part (string: forward, backward,
weight_cast, optimizer) on compute nodes; readers keep unknown attributes aside.

Times: duration_micros is a whole number of microseconds. Each compute node gets the difference of the
rounded running sums of the exact durations, so the rank's total is the exact total to within half a
microsecond however many nodes there are. tensor_size is an effective byte count: the bytes that make a
roofline of the accelerator's peak P and HBM bandwidth B give the node comet-dse's duration T,
    tensor_size = max(T, F / P) B
(ASTRA-sim's roofline mode, system "roofline-enabled": 1, then reproduces T; docs/export.md). num_ops is at
least 1: the roofline divides it by min(P, B num_ops / tensor_size), which is 0 for 0 FLOP (Roofline.cc).
"""
from __future__ import annotations

from comet_dse.export.chakra_schema import SCHEMA_VERSION, frame, schema
from comet_dse.export.schedule import COLL, COMP, RECV, SEND


def encode_rank(nodes: list, rank: int, peak: float, bandwidth: float) -> bytes:
    """One rank's ET file: GlobalMetadata, then its nodes (``peak`` FLOP/s and ``bandwidth`` bytes/s for
    tensor_size)."""
    s = schema()
    attr = s.AttributeProto
    meta = s.GlobalMetadata(version=SCHEMA_VERSION, attr=[
        attr(name="schema", string_val=f"chakra {SCHEMA_VERSION} (et_def.proto), written by comet-dse"),
        attr(name="rank", uint64_val=rank)])
    out = [frame(meta)]
    running = 0.0
    for n in nodes:
        node = s.Node(id=n.id, name=n.name, type=getattr(s, n.type), data_deps=n.deps)
        node.attr.append(attr(name="is_cpu_op", bool_val=False))
        if n.type == COMP:
            before = round(running * 1e6)
            running += n.seconds
            node.duration_micros = round(running * 1e6) - before
            node.attr.extend([attr(name="num_ops", int64_val=max(round(n.flops), 1)),
                              attr(name="tensor_size", uint64_val=round(max(n.seconds, n.flops / peak) * bandwidth)),
                              attr(name="comet_dse_part", string_val=n.part)])
        elif n.type == COLL:
            node.attr.extend([attr(name="comm_type", int64_val=getattr(s, n.comm)),
                              attr(name="comm_size", int64_val=round(n.size)),
                              attr(name="pg_name", string_val=str(n.group))])
        else:
            src, dst = (rank, n.peer) if n.type == SEND else (n.peer, rank)
            assert n.type in (SEND, RECV)
            node.attr.extend([attr(name="comm_src", int32_val=src), attr(name="comm_dst", int32_val=dst),
                              attr(name="comm_tag", int32_val=n.tag), attr(name="comm_size", int64_val=round(n.size))])
        out.append(frame(node))
    return b"".join(out)
