"""Fuzzing the wire format (docs/results/faults.md#fuzzing): any bytes given to a record
decoder come back as a record or as a SchemaError that names what is wrong, never as another exception; every valid record
round-trips to the same bytes; and a claim check resolves or is refused with a SchemaError.

Valid records are generated from the record types themselves (``msgspec.inspect``), so a new
record type or field is fuzzed without touching this file; the settings (cases per target,
the long profile) are in ``tests/fuzzing.py``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from fuzzing import fuzz
from hypothesis import event, example, given
from hypothesis import strategies as st

from astraflow.core.bus.types import Message
from astraflow.core.claims import unclaim
from astraflow.core.errors import AstraflowError, SchemaError
from astraflow.core.records import (
    SCHEMAS,
    Claim,
    Record,
    Task,
    Trajectory,
    decode,
    encode,
    schema_header,
    unpack,
)

KINDS: list[type[Record] | None] = [None, *SCHEMAS.values()]
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=12)


# ------------------------------------------------------------------------- valid records

def _json_like() -> st.SearchStrategy[Any]:
    """The values a free-form field (``Task.reference``) holds after a round trip."""
    leaves = st.none() | st.booleans() | INT64 | st.floats() | TEXT | st.binary(max_size=8)
    return st.recursive(leaves, lambda kids: st.lists(kids, max_size=3)
                        | st.dictionaries(TEXT, kids, max_size=3), max_leaves=8)


def _of(t: mi.Type) -> st.SearchStrategy[Any]:
    """A valid value of msgspec type ``t``."""
    if isinstance(t, mi.AnyType):
        return _json_like()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        return INT64
    if isinstance(t, mi.FloatType):
        return st.floats()
    if isinstance(t, mi.StrType):
        return TEXT
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=16)
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        return st.lists(_of(t.item_type), max_size=2)
    if isinstance(t, mi.DictType):
        return st.dictionaries(_of(t.key_type), _of(t.value_type), max_size=3)
    if isinstance(t, mi.TupleType):
        return st.tuples(*map(_of, t.item_types))
    if isinstance(t, mi.UnionType):
        return st.one_of(*map(_of, t.types))
    if isinstance(t, mi.StructType):
        return structs(t.cls)
    raise NotImplementedError(f"no strategy for {t!r}: add one to _of")


@st.composite
def structs(draw: st.DrawFn, cls: type[msgspec.Struct]) -> msgspec.Struct:
    """A valid instance of ``cls``: each field drawn from its type, optional ones sometimes
    left at their default; the cross-field rules of the records are kept (a trajectory's
    per-token arrays align, its turn rewards match its assistant spans, a group has refs or
    trajectories, not both)."""
    kwargs: dict[str, Any] = {}
    for f in mi.type_info(cls).fields:  # type: ignore[attr-defined]
        if f.name == "v" or (not f.required and draw(st.booleans())):
            continue
        kwargs[f.name] = draw(_of(f.type))
    if cls is Trajectory:
        n = draw(st.integers(0, 6))
        for name, width in (("token_ids", 4), ("loss_mask", 1), ("logprobs", 4),
                            ("versions", 4)):
            kwargs[name] = draw(st.binary(min_size=n * width, max_size=n * width))
        if kwargs.get("turn_rewards"):  # one per assistant span
            turns = sum(s.role == "assistant" for s in kwargs.get("spans", []))
            kwargs["turn_rewards"] = draw(st.lists(st.floats(allow_nan=False), min_size=turns,
                                                   max_size=turns))
    if kwargs.get("refs") and kwargs.get("trajectories"):
        kwargs[draw(st.sampled_from(["refs", "trajectories"]))] = []
    return cls(**kwargs)


RECORDS = st.sampled_from(sorted(SCHEMAS.values(), key=lambda c: c.__name__)).flatmap(structs)


@fuzz(200)
@given(RECORDS)
def test_every_record_round_trips_to_the_same_bytes(record: Record) -> None:
    data = encode(record)
    kind = type(record)
    assert encode(decode(data, kind)) == data
    assert encode(decode(data)) == data
    assert schema_header(record) == ("af-schema", f"{kind.__name__}/1".encode())
    plain = msgspec.msgpack.decode(data)  # a plain map any msgpack decoder reads
    assert plain["schema"] == kind.__name__ and plain["v"] == 1


# ------------------------------------------------------------------------- any bytes

def _decodes_or_refuses(data: bytes, kind: type[Record] | None) -> Record | SchemaError:
    """The property: a record of ``kind`` (any known one for None), or a SchemaError whose
    message names the record type expected. Any other exception fails the test."""
    try:
        record = decode(data, kind)
    except SchemaError as e:
        assert str(e), "a SchemaError says what is wrong"
        expected = kind.__name__ if kind is not None else "a known record"
        assert expected in str(e), str(e)
        event("refused: SchemaError")
        return e
    assert isinstance(record, kind or Record)
    event("decoded")
    return record


#: a value nested past the recursion limit inside a free-form field (Task.reference): msgspec
#: raised RecursionError, which the processor runtime does not isolate, so one such record
#: stopped the reader and stopped it again after every restart
DEEP_REFERENCE = msgspec.msgpack.encode(
    {"schema": "Task", "v": 1, "id": "t", "dataset": "d", "prompt": [],
     "reference": {"answer": msgspec.Raw(b"\x91" * 5000 + b"\xc0")}})


@fuzz(400)
@given(st.binary(max_size=256), st.sampled_from(KINDS))
@example(DEEP_REFERENCE, Task)
@example(DEEP_REFERENCE, None)
@example(b"\x81\xa6schema\xa4Task" + b"\x91" * 5000, None)
def test_any_bytes_give_a_record_or_a_schema_error(data: bytes, kind: type[Record] | None
                                                   ) -> None:
    _decodes_or_refuses(data, kind)


def test_a_deeply_nested_value_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="nests deeper"):
        decode(DEEP_REFERENCE, Task)
    shallow = DEEP_REFERENCE.replace(b"\x91" * 5000, b"\x91" * 50)
    assert isinstance(decode(shallow, Task), Task)


def _msgpack_values() -> st.SearchStrategy[Any]:
    """Any msgpack value: records' shapes are likely (maps with a schema tag and a version)."""
    leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
              | TEXT | st.binary(max_size=8) | st.sampled_from(list(SCHEMAS))
              | st.builds(msgspec.msgpack.Ext, st.integers(-128, 127), st.binary(max_size=8)))
    keys = st.sampled_from(["schema", "v", "id", "prompt", "token_ids", "tensors", "groups"]) | TEXT
    return st.recursive(leaves, lambda kids: st.lists(kids, max_size=4)
                        | st.dictionaries(keys, kids, max_size=5), max_leaves=12)


@st.composite
def wrong_shapes(draw: st.DrawFn) -> bytes:
    """Valid msgpack that is (mostly) not a valid record: any value, or a map with a schema
    tag, a version and fields of any type."""
    if draw(st.booleans()):
        return msgspec.msgpack.encode(draw(_msgpack_values()))
    body = draw(st.dictionaries(st.sampled_from(
        sorted({f.name for c in SCHEMAS.values() for f in mi.type_info(c).fields})),
        _msgpack_values(), max_size=6))
    body["schema"] = draw(st.sampled_from(list(SCHEMAS)) | _msgpack_values())
    body["v"] = draw(st.just(1) | _msgpack_values())
    return msgspec.msgpack.encode(body)


@fuzz(150)
@given(wrong_shapes(), st.sampled_from(KINDS))
def test_valid_msgpack_of_wrong_shapes_gives_a_record_or_a_schema_error(
        data: bytes, kind: type[Record] | None) -> None:
    _decodes_or_refuses(data, kind)


# ------------------------------------------------------------------------- mutations

@st.composite
def byte_mutations(draw: st.DrawFn) -> tuple[bytes, type[Record]]:
    """A valid record's encoding with bytes flipped, inserted, deleted or cut off."""
    record = draw(RECORDS)
    data = bytearray(encode(record))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "set"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0x90, 0xA0, 0xC0, 0xC1, 0xC4,
                                             0xCA, 0xCF, 0xD3, 0xDC, 0xDE, 0xDF, 0xFF]))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data), type(record)


@fuzz(400)
@given(byte_mutations(), st.booleans())
def test_mutated_encodings_give_a_record_or_a_schema_error(
        mutated: tuple[bytes, type[Record]], typed: bool) -> None:
    data, kind = mutated
    _decodes_or_refuses(data, kind if typed else None)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a decoded msgpack value (map keys and list indices)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def field_mutations(draw: st.DrawFn) -> tuple[bytes, type[Record], tuple[Any, ...], str]:
    """A valid record with one field (at any depth) set to a value of any type, or removed."""
    record = draw(RECORDS)
    plain = msgspec.msgpack.decode(encode(record))
    path = draw(st.sampled_from(_paths(plain)))
    parent = plain
    for p in path[:-1]:
        parent = parent[p]
    op = "remove" if isinstance(parent, dict) and draw(st.booleans()) else "set"
    if op == "remove":
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(_msgpack_values())
    return msgspec.msgpack.encode(plain), type(record), path, op


@fuzz(300)
@given(field_mutations(), st.booleans())
def test_a_field_of_the_wrong_type_is_named(
        mutated: tuple[bytes, type[Record], tuple[Any, ...], str], typed: bool) -> None:
    data, kind, path, _op = mutated
    result = _decodes_or_refuses(data, kind if typed else None)
    if not isinstance(result, SchemaError):
        return
    top = path[0]
    text = str(result)
    if top == "schema" and not typed:
        return  # another record type: msgspec names that type's first missing field
    if top == "v":
        assert "version" in text or "`$.v`" in text, text
    else:
        assert f"$.{top}" in text or f"`{top}`" in text or top in text, (top, text)


def test_a_wrong_type_is_named_by_its_path() -> None:
    # the shape of the messages the property above relies on
    bad = msgspec.msgpack.decode(encode(Task(id="t", dataset="d", prompt=[])))
    bad["prompt"] = [{"role": 3, "content": "x"}]
    with pytest.raises(SchemaError, match=r"invalid Task: Expected `str`, got `int` - at "
                                          r"`\$\.prompt\[0\]\.role`"):
        decode(msgspec.msgpack.encode(bad), Task)


# ------------------------------------------------------------------------- packed arrays

@fuzz(200)
@given(st.binary(max_size=64), st.sampled_from(["<i4", "<f4", "u1"]))
def test_packed_arrays_unpack_or_refuse(data: bytes, dtype: str) -> None:
    try:
        values = unpack(data, dtype)
    except SchemaError as e:
        assert dtype in str(e) and len(data) % 4
        return
    assert values.tobytes() == data


# ------------------------------------------------------------------------- claim checks

class MemoryStore:
    """A claim store in memory; a missing blob is an AstraflowError, as the real stores'."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, path: str, data: bytes | memoryview) -> None:
        self.blobs[path] = bytes(data)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        if path not in self.blobs:
            raise AstraflowError(f"no blob {path!r}")
        return self.blobs[path]


CORRUPTIONS = ["none", "no blob", "blob bytes", "uri", "size", "digest", "schema_of",
               "value bytes", "value shape"]


@st.composite
def claim_messages(draw: st.DrawFn) -> tuple[Message, MemoryStore, str]:
    """A message headed as a claim check: a real claim of a stored record, whole or with one
    thing wrong (the blob missing or other bytes, a field of the claim, its value any bytes
    or any msgpack)."""
    store = MemoryStore()
    record = draw(RECORDS)
    value = encode(record)
    digest = hashlib.sha256(value).hexdigest()
    uri = f"claims/{type(record).__name__}/{digest}.msgpack"
    fields = {"uri": uri, "schema_of": type(record).__name__, "size": len(value),
              "digest": digest}
    corrupt = draw(st.sampled_from(CORRUPTIONS))
    if corrupt != "no blob":
        store.put(uri, draw(st.binary(max_size=32)) if corrupt == "blob bytes" else value)
    if corrupt in fields:
        fields[corrupt] = draw(INT64 if corrupt == "size" else TEXT)
    data = encode(Claim(**fields))
    if corrupt == "value bytes":
        data = draw(st.binary(max_size=64))
    elif corrupt == "value shape":
        data = draw(wrong_shapes())
    headers = [("af-schema", b"Claim/1")] + draw(st.lists(st.tuples(TEXT, st.binary(max_size=8)),
                                                          max_size=2))
    msg = Message("t", 0, draw(st.integers(0, 100)), b"k", data, headers)
    return msg, store, corrupt


@fuzz(200)
@given(claim_messages(), st.booleans())
def test_a_claim_check_resolves_or_is_refused(case: tuple[Message, MemoryStore, str],
                                              with_store: bool) -> None:
    msg, store, corrupt = case
    try:
        out = unclaim(msg, store if with_store else None)
    except SchemaError as e:
        assert str(e)
        event("refused: SchemaError")
        return
    event("resolved")
    assert with_store and corrupt in ("none", "schema_of", "value shape"), corrupt
    claim = decode(msg.value, Claim)
    assert isinstance(claim, Claim)
    assert len(out.value) == claim.size
    assert hashlib.sha256(out.value).hexdigest() == claim.digest
    if claim.schema_of in SCHEMAS:
        assert out.header("af-schema") == f"{claim.schema_of}/1".encode()
    assert out.key == msg.key and out.offset == msg.offset


def test_the_strategies_know_every_field_type() -> None:
    """A new field type fails here (add it to ``_of``), not silently in the fuzz targets."""
    for cls in SCHEMAS.values():
        for f in mi.type_info(cls).fields:  # type: ignore[attr-defined]
            assert _of(f.type) is not None, (cls.__name__, f.name)
