"""Static fidelity check: OUR proto/ files against the OFFICIAL messages and services.

Our ``proto/talos/**/*.proto`` are compiled with protoc (from grpcio-tools) into descriptors,
and every message, field, enum value and RPC is compared with the classes generated from the
official Talos protos (PyPI ``talos-linux-api-v1-6-0``). This covers the messages the
emulator run does not exercise (Reset, HealthCheck, ...) and both directions of the wire.

The package is Talos v1.6.0; our protos follow v1.13.8. What Talos added after v1.6 is
listed in ``NEWER_*`` below; any other type, field or enum value of ours that the official
protos lack, or that differs in name, type or cardinality, fails.
``cosi.resource`` is not in the package; it is compared with ``cosi_messages.py``.
"""

import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import betterproto
import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto" / "talos"
OFFICIAL = "talos_linux_api.v1_6_0"

MODULES = {
    "common": f"{OFFICIAL}.common",
    "machine": f"{OFFICIAL}.machine",
    "cluster": f"{OFFICIAL}.cluster",
    "storage": f"{OFFICIAL}.storage",
    "google.rpc": f"{OFFICIAL}.google.rpc",
    "cosi.resource": "cosi_messages",
}

# Declared by Talos after v1.6.0, so absent from the package (each still checked to be absent,
# so that a newer package makes the exception fail and go away).
NEWER_TYPES = {"common.PEMEncodedCertificate"}
# (message, field number)
NEWER_FIELDS: set = set()
# (enum, value number)
NEWER_ENUM_VALUES = {
    ("storage.Disk.DiskType", 5),  # CD
    ("machine.RebootRequest.Mode", 2),  # FORCE
}

F = descriptor_pb2.FieldDescriptorProto
SCALAR = {
    F.TYPE_DOUBLE: "double", F.TYPE_FLOAT: "float", F.TYPE_INT64: "int64",
    F.TYPE_UINT64: "uint64", F.TYPE_INT32: "int32", F.TYPE_FIXED64: "fixed64",
    F.TYPE_FIXED32: "fixed32", F.TYPE_BOOL: "bool", F.TYPE_STRING: "string",
    F.TYPE_BYTES: "bytes", F.TYPE_UINT32: "uint32", F.TYPE_ENUM: "enum",
    F.TYPE_SFIXED32: "sfixed32", F.TYPE_SFIXED64: "sfixed64", F.TYPE_SINT32: "sint32",
    F.TYPE_SINT64: "sint64", F.TYPE_MESSAGE: "message",
}


def compile_ours() -> descriptor_pb2.FileDescriptorSet:
    import grpc_tools

    wkt = Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "talos.pb"
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{wkt}",
             f"--descriptor_set_out={out}", *files],
            check=True,
        )
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(out.read_bytes())
        return fds


def official_class(package: str, nested_name: list):
    module = importlib.import_module(MODULES[package])
    # betterproto flattens nested names and pascal-cases them (NetIPPrefix -> NetIpPrefix).
    wanted = "".join(nested_name).lower()
    for attr in dir(module):
        if attr.lower() == wanted:
            return getattr(module, attr)
    return None


def walk(fds):
    """(package, [names], DescriptorProto or EnumDescriptorProto) for every type of ours."""
    for f in fds.file:
        def rec(prefix, msgs, enums):
            for e in enums:
                yield f.package, prefix + [e.name], e
            for m in msgs:
                if m.options.map_entry:
                    continue
                yield f.package, prefix + [m.name], m
                yield from rec(prefix + [m.name], m.nested_type, m.enum_type)
        yield from rec([], f.message_type, f.enum_type)


FDS = compile_ours()
TYPES = list(walk(FDS))


def ids(item):
    package, names, _ = item
    return f"{package}.{'.'.join(names)}"


@pytest.mark.parametrize("item", TYPES, ids=[ids(t) for t in TYPES])
def test_type_matches_official(item):
    package, names, desc = item
    full = ids(item)
    cls = official_class(package, names)
    if full in NEWER_TYPES:
        assert cls is None, f"{full}: now official, drop the exception"
        return
    assert cls is not None, f"{full}: no such type in the official protos"
    if isinstance(desc, descriptor_pb2.EnumDescriptorProto):
        official = {v.value: v.name for v in cls}
        for v in desc.value:
            if (full, v.number) in NEWER_ENUM_VALUES:
                assert v.number not in official, f"{full}.{v.name}: now official"
                continue
            assert v.number in official, f"{full}.{v.name} = {v.number}: not official"
            # betterproto strips the enum's own prefix from value names
            assert official[v.number] in (v.name, re.sub(r"^[A-Z_]*?_", "", v.name)) or \
                v.name.endswith(official[v.number]), (full, v.name, official[v.number])
        return

    meta = cls._betterproto
    official = {m.number: (name, m) for name, m in meta.meta_by_field_name.items()}
    map_entries = {m.name: m for m in desc.nested_type if m.options.map_entry}
    for field in desc.field:
        where = f"{full}.{field.name} = {field.number}"
        if (full, field.number) in NEWER_FIELDS:
            assert field.number not in official, f"{where}: now official, drop the exception"
            continue
        assert field.number in official, f"{where}: not in the official message"
        name, m = official[field.number]
        assert name == betterproto.casing.snake_case(field.name), (
            f"{where}: the official field {field.number} is {name!r}")
        is_map = field.type_name.rsplit(".", 1)[-1] in map_entries
        if is_map:
            assert m.proto_type == "map", f"{where}: official is {m.proto_type}"
            continue
        assert m.proto_type == SCALAR[field.type], (
            f"{where}: ours is {SCALAR[field.type]}, official is {m.proto_type}")
        repeated = field.label == F.LABEL_REPEATED
        official_repeated = meta.default_gen[name] is list
        assert repeated == official_repeated, f"{where}: repeated ours={repeated}"
        if field.type == F.TYPE_MESSAGE and not field.type_name.startswith(".google.protobuf."):
            # the official field's message class has the same (short) name
            official_cls = meta.cls_by_field[name]
            short = field.type_name.rsplit(".", 1)[-1].lower()
            assert official_cls.__name__.lower().endswith(short), (
                f"{where}: type {field.type_name}, official {official_cls.__name__}")


METHODS = [
    (f"/{f.package}.{s.name}/{m.name}", m)
    for f in FDS.file for s in f.service for m in s.method
]


@pytest.mark.parametrize("path,method", METHODS, ids=[p for p, _ in METHODS])
def test_rpc_matches_official(path, method):
    package = path[1:].rsplit(".", 1)[0]
    module = importlib.import_module(MODULES[package])
    source = Path(module.__file__).read_text()
    # the generated stub: self._unary_unary("/pkg.Service/Method", request, ResponseType, ...)
    found = re.search(
        r"self\._(unary_unary|unary_stream|stream_unary|stream_stream)\(\s*"
        + re.escape(f'"{path}"') + r",\s*\w+,\s*(?:[\w.]+\.)?(\w+),",
        source,
    )
    assert found, f"{path}: not an official RPC"
    kind, response = found.groups()
    ours = ("stream" if method.client_streaming else "unary") + "_" + (
        "stream" if method.server_streaming else "unary")
    assert kind == ours, f"{path}: official {kind}, ours {ours}"
    assert response.lower().endswith(method.output_type.rsplit(".", 1)[-1].lower()), (
        f"{path}: returns {method.output_type}, official {response}")
