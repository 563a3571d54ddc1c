"""The Chakra execution-trace schema (et_def.proto, Chakra 1.0.0) as protobuf message classes, and its file format.

The schema is the vendored et_def.proto beside this module (source and licence in its header), compiled by
scripts/chakra_descriptor.py into _et_def_descriptor.py; the classes are built from that descriptor with
the protobuf runtime alone (the ``export`` extra: pip install 'comet-dse[export]').

An ET file is one GlobalMetadata message and then the Node messages, each preceded by its length as a
varint (Chakra src/third_party/utils/protolib.py: encodeMessage / decodeMessage; the C++ feeder reads the
same framing). A zero length ends the file for Chakra's Python reader, so no message may serialize to
zero bytes: every node here carries a name and the metadata a version.
"""
from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

from comet_dse.base.errors import InputError

SCHEMA_VERSION = "1.0.0"     # Chakra's version of et_def.proto (its pyproject.toml at the vendored commit)
MESSAGES = ("GlobalMetadata", "Node", "AttributeProto", "IOInfo", "BoolList")


@lru_cache(maxsize=1)
def schema() -> SimpleNamespace:
    """The message classes (``MESSAGES``) and enums (NodeType, CollectiveCommType values by name)."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise InputError("export", "Chakra traces need protobuf: pip install 'comet-dse[export]'") from None
    from comet_dse.export._et_def_descriptor import SERIALIZED

    pool = descriptor_pool.DescriptorPool()
    fd = pool.Add(descriptor_pb2.FileDescriptorProto.FromString(SERIALIZED))
    if not hasattr(fd, "message_types_by_name"):     # protobuf releases whose pool.Add returns nothing
        fd = pool.FindFileByName("et_def.proto")
    classes = {name: message_factory.GetMessageClass(fd.message_types_by_name[name]) for name in MESSAGES}
    enums = {v.name: v.number for e in fd.enum_types_by_name.values() for v in e.values}
    return SimpleNamespace(**classes, **enums)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(0x80 | bits)
        else:
            out.append(bits)
            return bytes(out)


def frame(message) -> bytes:
    """``message`` serialized with its length as a varint in front (protolib.encodeMessage)."""
    data = message.SerializeToString()
    if not data:
        raise ValueError("a Chakra message may not be empty: the readers take a zero length as the end")
    return _varint(len(data)) + data


def read_messages(data: bytes) -> list:
    """The length-prefixed payloads of an ET file's bytes, in order (protolib.decodeMessage's framing)."""
    out, pos = [], 0
    while pos < len(data):
        size = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if size == 0:
            break
        out.append(data[pos:pos + size])
        pos += size
    return out


def read_trace(data: bytes) -> tuple:
    """(GlobalMetadata, [Node]) of an ET file's bytes."""
    s = schema()
    payloads = read_messages(data)
    if not payloads:
        raise ValueError("an empty Chakra trace")
    return s.GlobalMetadata.FromString(payloads[0]), [s.Node.FromString(p) for p in payloads[1:]]
