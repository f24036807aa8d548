"""Protobuf schemas compiled at run time (protoc in-process): columns, which writers a reader reads, and the
decoding of wire-format records, bit for bit for every scalar type (issue 32)."""

from __future__ import annotations

import decimal
import json
import math
import struct

import pytest
from google.protobuf import message_factory

from reclock import protobuf_schema as pb
from reclock.registry_plan import writer_columns
from reclock.wire import encode

ROW = """syntax = "proto3";
package shop;
message Row {
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5; sint64 s64 = 6;
  fixed32 f32 = 7; fixed64 f64 = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10; float fl = 11; double db = 12;
  bool b = 13; string s = 14; bytes by = 15; Kind kind = 16; Inner inner = 17; repeated Inner items = 18;
  map<string, sint64> tags = 19; optional int32 maybe = 20;
  enum Kind { A = 0; B = 1; }
  message Inner { string name = 1; repeated double xs = 2; }
}
message Other { int32 x = 1; }
"""


def cls(text: str):
    return message_factory.GetMessageClass(pb.compiled(text).message)


def test_columns_of_every_type():
    cols = writer_columns("protobuf", ROW)
    assert [(c.name, c.type) for c in cols.columns] == [
        ("i32", "int"), ("i64", "bigint"), ("u32", "bigint"), ("u64", "decimal(20,0)"), ("s32", "int"),
        ("s64", "bigint"), ("f32", "bigint"), ("f64", "decimal(20,0)"), ("sf32", "int"), ("sf64", "bigint"),
        ("fl", "float"), ("db", "double"), ("b", "boolean"), ("s", "string"), ("by", "binary"), ("kind", "string"),
        ("inner", "struct<name:string,xs:array<double>>"), ("items", "array<struct<name:string,xs:array<double>>>"),
        ("tags", "map<string,bigint>"), ("maybe", "int")]
    with pytest.raises(pb.ProtobufSchemaError, match="does not compile: .*Expected"):
        writer_columns("protobuf", "syntax = \"proto3\"; message {")
    with pytest.raises(pb.ProtobufSchemaError, match="next: message t.Node contains itself"):
        writer_columns("protobuf", 'syntax = "proto3"; package t; message Node { Node next = 1; }')


def test_decode_bit_for_bit_and_presence():
    nan32 = struct.unpack("<f", struct.pack("<I", 0x7FC00123))[0]
    nan64 = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000ABC))[0]
    m = cls(ROW)(i32=-2**31, i64=-2**63, u32=2**32 - 1, u64=2**64 - 1, s32=-1, s64=2**63 - 1, f32=2**32 - 1,
                 f64=2**64 - 1, sf32=-7, sf64=-2**63, fl=nan32, db=nan64, b=True, s="żółw \x00", by=b"\x00\xff",
                 kind=1)
    m.inner.name = "in"
    m.inner.xs.extend([-0.0, math.inf])
    m.items.add(name="a")
    m.tags["k"] = -5
    header_paths = {1: pb.compiled(ROW).paths()}
    dec = pb.Decoder(pb.compile_bundle(ROW), header_paths, {})
    row, why = dec.decode(encode(1, m.SerializeToString(), [0]))
    assert why is None
    assert (row["i32"], row["i64"], row["u32"], row["u64"]) == (-2**31, -2**63, 2**32 - 1, decimal.Decimal(2**64 - 1))
    assert (row["s32"], row["s64"], row["f32"], row["f64"], row["sf32"], row["sf64"]) == \
        (-1, 2**63 - 1, 2**32 - 1, decimal.Decimal(2**64 - 1), -7, -2**63)
    assert struct.pack("<f", row["fl"]) == struct.pack("<I", 0x7FC00123)
    assert struct.pack("<d", row["db"]) == struct.pack("<Q", 0xFFF8000000000ABC)
    assert (row["b"], row["s"], row["by"], row["kind"]) == (True, "żółw \x00", b"\x00\xff", "B")
    assert row["inner"]["name"] == "in" and math.copysign(1, row["inner"]["xs"][0]) == -1
    assert row["items"] == [{"name": "a", "xs": []}] and row["tags"] == [("k", -5)]
    assert row["maybe"] is None  # explicit presence, not set: null; implicit presence: its default
    empty, _ = dec.decode(encode(1, b"", [0]))
    assert empty["i32"] == 0 and empty["s"] == "" and empty["inner"] is None and empty["kind"] == "A"
    # the [0] shortcut and the explicit one-index array decode the same
    assert repr(dec.decode(b"\x00\x00\x00\x00\x01\x02\x00" + m.SerializeToString())) == repr((row, None))


def test_decode_errors_name_the_cause():
    dec = pb.Decoder(pb.compile_bundle(ROW), {1: pb.compiled(ROW).paths()}, {2: "s: singular int32 in the writer"})
    assert dec.decode(b"{}")[1] == pb.NO_HEADER
    assert dec.decode(encode(9, b"", [0]))[1] == "schema id 9 is not known to the schema registry"
    assert dec.decode(encode(2, b"", [0]))[1] == \
        "writer schema 2 cannot be read as the collection's schema: s: singular int32 in the writer"
    assert "name message shop.Other of writer schema 1; the source reads shop.Row" in \
        dec.decode(encode(1, b"", [1]))[1]
    assert dec.decode(encode(1, b"\xff", [0]))[1].startswith("value does not decode as Protobuf shop.Row")
    assert "enum number 7" in dec.decode(encode(1, b"\x80\x01\x07", [0]))[1]


def test_problem_by_field_number():
    base = 'syntax = "proto3"; package t; message M { int32 a = 1; string b = 2; %s }'
    assert pb.problem(base % "", base % "") is None
    assert pb.problem(base % "optional int64 c = 3;", base % "") is None  # an older writer lacks c
    assert pb.problem(base % "", base % "optional int64 c = 3;") is None  # the reader skips c
    widened = 'syntax = "proto3"; package t; message M { int64 a = 1; string b = 2; }'
    assert pb.problem(widened, base % "") is None  # int32 -> int64: same varints
    assert pb.problem(base % "", widened) == "a: singular int64 in the writer, singular int32 in the reader"
    assert pb.problem(base % "", base.replace("string b = 2", "string c = 2") % "") == \
        "c: field number 2 is `c` in the writer and `b` in the reader"
    assert "message is t.N" in pb.problem(base % "", base.replace("message M", "message N") % "")


def test_bundle_with_imports():
    class Ref:
        def __init__(self, name):
            self.name = name

    class Reg:
        def __init__(self, text, refs=()):
            self.text, self.references = text, refs

    dep = Reg('syntax = "proto3"; package d; message Money { sint64 units = 1; }')
    main = Reg('syntax = "proto3"; package t; import "d/money.proto"; message M { d.Money price = 1; }',
               ((Ref("d/money.proto"), dep),))
    text = pb.bundle(main)
    assert json.loads(text)["imports"] == {"d/money.proto": dep.text}
    assert [(c.name, c.type) for c in writer_columns("protobuf", text).columns] == [("price", "struct<units:bigint>")]
