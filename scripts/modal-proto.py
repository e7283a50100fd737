#!/usr/bin/env python3
"""Regenerates crates/glovebox-daemon/proto/modal/*.proto from the pinned `modal` wheel.

The `modal` client (PyPI, Apache-2.0) ships its protocol as compiled descriptors
(`modal_proto/*_pb2.py`, each holding a serialized FileDescriptorProto). This script downloads
the pinned wheel (no dependencies) into a temporary directory, loads those descriptors and
prints them back as `.proto` source, which the daemon's build compiles (protox, no protoc).
The output is vendored: builds never need the network.

Usage: scripts/modal-proto.py [OUT_DIR]   (default: crates/glovebox-daemon/proto/modal)
Needs python3 with venv and pip, and PyPI.
"""

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

MODAL_VERSION = "1.6.4"
# Only used to decode the descriptors (descriptor_pb2); not part of the output.
PROTOBUF_VERSION = "7.36.2"
FILES = ["api", "task_command_router"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serialized_descriptor(py_source):
    """The bytes passed to AddSerializedFile(...) in a generated *_pb2.py."""
    for node in ast.walk(ast.parse(py_source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            return node.args[0].value
    raise SystemExit("no AddSerializedFile(...) call found")


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "crates/glovebox-daemon/proto/modal"))
    tmp = tempfile.mkdtemp(prefix="modal-proto-")
    try:
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = [os.path.join(venv, "bin/python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run(pip + ["install", f"protobuf=={PROTOBUF_VERSION}"], check=True)
        subprocess.run(pip + ["download", "--no-deps", f"modal=={MODAL_VERSION}", "-d", tmp], check=True)
        wheel = os.path.join(tmp, f"modal-{MODAL_VERSION}-py3-none-any.whl")
        blobs = {}
        with zipfile.ZipFile(wheel) as z:
            for f in FILES:
                blobs[f] = serialized_descriptor(z.read(f"modal_proto/{f}_pb2.py").decode())
            license_text = z.read(f"modal-{MODAL_VERSION}.dist-info/licenses/LICENSE")
        # The printer runs in the venv, where descriptor_pb2 is.
        blob_dir = os.path.join(tmp, "blobs")
        os.makedirs(blob_dir)
        for f, b in blobs.items():
            with open(os.path.join(blob_dir, f + ".pb"), "wb") as fh:
                fh.write(b)
        os.makedirs(out, exist_ok=True)
        subprocess.run(
            [os.path.join(venv, "bin/python"), os.path.abspath(__file__), "--print", blob_dir, out] + FILES,
            check=True,
        )
        with open(os.path.join(out, "LICENSE"), "wb") as fh:
            fh.write(license_text)
        print(f"wrote {', '.join(f + '.proto' for f in FILES)} and LICENSE to {out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# FileDescriptorProto -> .proto text (runs inside the venv)
# ---------------------------------------------------------------------------------------

SCALARS = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32",
    8: "bool", 9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64",
    17: "sint32", 18: "sint64",
}


def quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Printer:
    def __init__(self, fd):
        self.fd = fd
        self.lines = []
        self.proto3 = fd.syntax == "proto3"
        self.unknown = 0

    def w(self, depth, text):
        self.lines.append("  " * depth + text if text else "")

    def check_unknown(self, opts):
        # Custom options would be unknown fields here; they never change the wire format.
        known = type(opts)()
        known.CopyFrom(opts)
        known.DiscardUnknownFields()
        if known.ByteSize() != opts.ByteSize():
            self.unknown += 1

    def field_type(self, f, msg):
        if f.type in (11, 14):  # message, enum
            return f.type_name
        if f.type == 10:
            raise SystemExit(f"group fields are not supported ({f.name})")
        return SCALARS[f.type]

    def map_entry(self, f, msg):
        if f.type != 11 or f.label != 3:
            return None
        short = f.type_name.rsplit(".", 1)[-1]
        for n in msg.nested_type:
            if n.name == short and n.options.map_entry:
                k, v = n.field[0], n.field[1]
                return f"map<{self.field_type(k, n)}, {self.field_type(v, n)}>"
        return None

    def field_options(self, f):
        opts = []
        if f.options.HasField("deprecated"):
            opts.append(f"deprecated = {str(f.options.deprecated).lower()}")
        if f.options.HasField("packed"):
            opts.append(f"packed = {str(f.options.packed).lower()}")
        if f.HasField("default_value"):
            v = f.default_value if f.type not in (9, 12) else quote(f.default_value)
            opts.append(f"default = {v}")
        self.check_unknown(f.options)
        return f" [{', '.join(opts)}]" if opts else ""

    def field(self, depth, f, msg, in_oneof):
        t = self.map_entry(f, msg)
        if t is not None:
            label = ""
        else:
            t = self.field_type(f, msg)
            if f.label == 3:
                label = "repeated "
            elif in_oneof:
                label = ""
            elif self.proto3:
                label = "optional " if f.proto3_optional else ""
            else:
                label = "required " if f.label == 2 else "optional "
        self.w(depth, f"{label}{t} {f.name} = {f.number}{self.field_options(f)};")

    def reserved(self, depth, ranges, names, exclusive_end):
        parts = []
        for r in ranges:
            end = r.end - 1 if exclusive_end else r.end
            parts.append(str(r.start) if r.start == end else f"{r.start} to {'max' if end >= 536870911 else end}")
        if parts:
            self.w(depth, f"reserved {', '.join(parts)};")
        if names:
            self.w(depth, f"reserved {', '.join(quote(n) for n in names)};")

    def enum(self, depth, e):
        self.w(depth, f"enum {e.name} {{")
        if e.options.HasField("allow_alias"):
            self.w(depth + 1, f"option allow_alias = {str(e.options.allow_alias).lower()};")
        if e.options.HasField("deprecated"):
            self.w(depth + 1, f"option deprecated = {str(e.options.deprecated).lower()};")
        self.check_unknown(e.options)
        for v in e.value:
            o = " [deprecated = true]" if v.options.deprecated else ""
            self.check_unknown(v.options)
            self.w(depth + 1, f"{v.name} = {v.number}{o};")
        self.reserved(depth + 1, e.reserved_range, e.reserved_name, exclusive_end=False)
        self.w(depth, "}")

    def message(self, depth, m):
        self.w(depth, f"message {m.name} {{")
        if m.options.HasField("deprecated"):
            self.w(depth + 1, f"option deprecated = {str(m.options.deprecated).lower()};")
        self.check_unknown(m.options)
        if m.extension_range or m.extension:
            raise SystemExit(f"extensions are not supported ({m.name})")
        for e in m.enum_type:
            self.enum(depth + 1, e)
        for n in m.nested_type:
            if not n.options.map_entry:
                self.message(depth + 1, n)
        # Real oneofs (not the synthetic ones of proto3 `optional`) are printed where their
        # first field is.
        real = {i for i, _ in enumerate(m.oneof_decl)}
        for f in m.field:
            if f.HasField("oneof_index") and f.proto3_optional:
                real.discard(f.oneof_index)
        done = set()
        for f in m.field:
            if f.HasField("oneof_index") and f.oneof_index in real:
                i = f.oneof_index
                if i in done:
                    continue
                done.add(i)
                self.w(depth + 1, f"oneof {m.oneof_decl[i].name} {{")
                for g in m.field:
                    if g.HasField("oneof_index") and g.oneof_index == i:
                        self.field(depth + 2, g, m, in_oneof=True)
                self.w(depth + 1, "}")
            else:
                self.field(depth + 1, f, m, in_oneof=False)
        self.reserved(depth + 1, m.reserved_range, m.reserved_name, exclusive_end=True)
        self.w(depth, "}")

    def service(self, s):
        self.w(0, f"service {s.name} {{")
        self.check_unknown(s.options)
        for r in s.method:
            cs = "stream " if r.client_streaming else ""
            ss = "stream " if r.server_streaming else ""
            self.check_unknown(r.options)
            body = " { option deprecated = true; }" if r.options.deprecated else ";"
            self.w(1, f"rpc {r.name}({cs}{r.input_type}) returns ({ss}{r.output_type}){body}")
        self.w(0, "}")

    def file(self, version):
        fd = self.fd
        self.w(0, f"// Regenerated by scripts/modal-proto.py from the descriptors in modal=={version}")
        self.w(0, "// (PyPI, modal_proto/). Apache-2.0: see LICENSE beside this file. Do not edit.")
        self.w(0, "")
        if fd.syntax == "editions":
            raise SystemExit("editions files are not supported")
        self.w(0, f'syntax = "{fd.syntax or "proto2"}";')
        self.w(0, "")
        self.w(0, f"package {fd.package};")
        self.w(0, "")
        for d in fd.dependency:
            # The wheel names its files modal_proto/X.proto; here they sit side by side.
            self.w(0, f"import {quote(d.replace('modal_proto/', ''))};")
        if fd.options.HasField("go_package"):
            self.w(0, "")
            self.w(0, f"option go_package = {quote(fd.options.go_package)};")
        self.check_unknown(fd.options)
        for e in fd.enum_type:
            self.w(0, "")
            self.enum(0, e)
        for m in fd.message_type:
            self.w(0, "")
            self.message(0, m)
        for s in fd.service:
            self.w(0, "")
            self.service(s)
        return "\n".join(self.lines) + "\n"


def print_files(blob_dir, out, names):
    from google.protobuf import descriptor_pb2

    for n in names:
        fd = descriptor_pb2.FileDescriptorProto()
        with open(os.path.join(blob_dir, n + ".pb"), "rb") as fh:
            fd.ParseFromString(fh.read())
        p = Printer(fd)
        text = p.file(MODAL_VERSION)
        with open(os.path.join(out, n + ".proto"), "w") as fh:
            fh.write(text)
        note = f" ({p.unknown} options with custom extensions left out)" if p.unknown else ""
        print(f"{n}.proto: {len(fd.message_type)} messages, {len(fd.enum_type)} enums, "
              f"{sum(len(s.method) for s in fd.service)} rpcs{note}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--print":
        print_files(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main()
