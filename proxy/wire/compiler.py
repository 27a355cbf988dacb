"""Turns a message spec + version into a ``construct`` struct, compiled and cached per (spec, version).

The primitives follow Kafka's serialisation rules (org.apache.kafka.common.protocol.types.Type and the
generated ``*Data.read/write`` methods of MessageDataGenerator):

- non-flexible versions: string = int16 length (-1 null), bytes/records = int32 length (-1 null),
  array = int32 count (-1 null);
- flexible versions (KIP-482): compact forms with unsigned-varint length+1 (0 = null), and a tagged-field
  section after every struct: uvarint count, then (uvarint tag, uvarint size, value) in ascending tag order;
  a tagged field is written only when it differs from its default;
- Sluice's own record specs add zigzag varint/varlong, uint32 and varint-length bytes/strings (the Record
  layout of KIP-98).

Every length and count is checked against the bytes remaining *before* anything is read or allocated
(Kafka's "Tried to allocate a collection of size N, but there are only M bytes remaining" check), so a frame
declaring 2 GiB fails at once with a CodecError.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

import construct as cs

from .errors import CodecError
from .model import Message
from .schema import FieldSpec, MessageSpec

# --------------------------------------------------------------------------------------------- helpers


def _read(stream: io.BytesIO, n: int, what: str) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise CodecError(f"truncated {what}: needed {n} bytes, {len(data)} left", where=stream.tell())
    return data


def _remaining(stream: io.BytesIO) -> int:
    return stream.getbuffer().nbytes - stream.tell()


def read_uvarint(stream: io.BytesIO, max_bytes: int = 5) -> int:
    """Kafka ByteUtils.readUnsignedVarint: LEB128, at most 5 bytes for 32-bit values."""
    value = 0
    shift = 0
    for _ in range(max_bytes):
        b = stream.read(1)
        if not b:
            raise CodecError("truncated varint", where=stream.tell())
        byte = b[0]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    raise CodecError(f"varint longer than {max_bytes} bytes", where=stream.tell())


def write_uvarint(value: int) -> bytes:
    if value < 0:
        raise CodecError(f"negative unsigned varint {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag_decode(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def zigzag_encode(n: int, bits: int) -> int:
    return ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1)


# --------------------------------------------------------------------------------------------- constructs


class UVarInt(cs.Construct):
    """Unsigned varint (compact lengths, tag numbers and sizes)."""

    def _parse(self, stream: Any, context: Any, path: str) -> int:
        return read_uvarint(stream)

    def _build(self, obj: int, stream: Any, context: Any, path: str) -> int:
        stream.write(write_uvarint(obj))
        return obj


class ZigZag(cs.Construct):
    """Signed zigzag varint (32 bit, up to 5 bytes) or varlong (64 bit, up to 10 bytes)."""

    def __init__(self, bits: int) -> None:
        super().__init__()
        self.bits = bits
        self.max_bytes = 5 if bits == 32 else 10

    def _parse(self, stream: Any, context: Any, path: str) -> int:
        return zigzag_decode(read_uvarint(stream, self.max_bytes))

    def _build(self, obj: int, stream: Any, context: Any, path: str) -> int:
        lim = 1 << (self.bits - 1)
        if not -lim <= obj < lim:
            raise CodecError(f"value {obj} out of range for a {self.bits}-bit varint")
        stream.write(write_uvarint(zigzag_encode(obj, self.bits)))
        return obj


class Fixed(cs.Construct):
    """A fixed-width big-endian number (struct format), with range checking on build."""

    def __init__(self, fmt: str, name: str) -> None:
        super().__init__()
        self.st = struct.Struct(">" + fmt)
        self.kind = name

    def _parse(self, stream: Any, context: Any, path: str) -> Any:
        return self.st.unpack(_read(stream, self.st.size, self.kind))[0]

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        try:
            stream.write(self.st.pack(obj))
        except struct.error as e:
            raise CodecError(f"{self.kind} value {obj!r}: {e}") from None
        return obj


class Bool(cs.Construct):
    """Kafka BOOLEAN: one byte, any non-zero value is true."""

    def _parse(self, stream: Any, context: Any, path: str) -> bool:
        return _read(stream, 1, "bool") != b"\x00"

    def _build(self, obj: bool, stream: Any, context: Any, path: str) -> bool:
        stream.write(b"\x01" if obj else b"\x00")
        return obj


_LENGTHS: dict[str, cs.Construct] = {
    "int16": Fixed("h", "int16"),
    "int32": Fixed("i", "int32"),
    "uvarint": UVarInt(),
    "varint": ZigZag(32),
}


class Sized(cs.Construct):
    """A length-prefixed string or bytes value.

    ``length`` is how the length is written: "int16" / "int32" (-1 = null), "uvarint" (length+1, 0 = null,
    the compact form) or "varint" (zigzag, -1 = null, Record keys/values/headers).
    """

    def __init__(self, length: str, *, text: bool, nullable: bool, what: str) -> None:
        super().__init__()
        self.length = _LENGTHS[length]
        self.compact = length == "uvarint"
        self.text = text
        self.nullable = nullable
        self.what = what

    def _parse(self, stream: Any, context: Any, path: str) -> Any:
        n = self.length._parse(stream, context, path)
        if self.compact:
            n -= 1
        if n < 0:
            if n == -1 and self.nullable:
                return None
            raise CodecError(f"{self.what}: length {n} (null not allowed here)", where=stream.tell())
        if n > _remaining(stream):
            raise CodecError(
                f"{self.what}: declared length {n} exceeds the {_remaining(stream)} bytes remaining",
                where=stream.tell(),
            )
        data = stream.read(n)
        if self.text:
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise CodecError(f"{self.what}: invalid UTF-8", where=stream.tell()) from None
        return data

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        if obj is None:
            if not self.nullable:
                raise CodecError(f"{self.what}: null not allowed")
            self.length._build(0 if self.compact else -1, stream, context, path)
            return obj
        data = obj.encode("utf-8") if self.text else obj
        n = len(data)
        self.length._build(n + 1 if self.compact else n, stream, context, path)
        stream.write(data)
        return obj


class Array(cs.Construct):
    """An array: int32 count (-1 null), uvarint count+1 (compact, 0 null) or zigzag varint count."""

    def __init__(self, element: cs.Construct, count: str, *, nullable: bool, what: str) -> None:
        super().__init__()
        self.element = element
        self.count = _LENGTHS[count]
        self.compact = count == "uvarint"
        self.nullable = nullable
        self.what = what

    def _parse(self, stream: Any, context: Any, path: str) -> Any:
        n = self.count._parse(stream, context, path)
        if self.compact:
            n -= 1
        if n < 0:
            if n == -1 and self.nullable:
                return None
            raise CodecError(f"{self.what}: array count {n} (null not allowed here)", where=stream.tell())
        # Every element takes at least one byte except empty structs; reject impossible counts before looping.
        if n > _remaining(stream):
            raise CodecError(
                f"{self.what}: array count {n} exceeds the {_remaining(stream)} bytes remaining",
                where=stream.tell(),
            )
        parse = self.element._parse
        return [parse(stream, context, path) for _ in range(n)]

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        if obj is None:
            if not self.nullable:
                raise CodecError(f"{self.what}: null array not allowed")
            self.count._build(0 if self.compact else -1, stream, context, path)
            return obj
        n = len(obj)
        self.count._build(n + 1 if self.compact else n, stream, context, path)
        build = self.element._build
        for item in obj:
            build(item, stream, context, path)
        return obj


class KafkaStruct(cs.Construct):
    """A Kafka struct at one version: its fields in order, then (flexible versions) the tagged fields."""

    def __init__(
        self,
        name: str,
        fields: list[tuple[str, cs.Construct, Any]],
        tagged: dict[int, tuple[str, cs.Construct, Any]] | None,
    ) -> None:
        super().__init__()
        self.struct_name = name
        self.plain = fields
        self.tagged = tagged  # None: not flexible (no tag section)

    def default(self) -> Message:
        """The struct with every field at its default (Kafka's no-arg constructor)."""
        out = Message()
        for fname, sub, dflt in self.plain:
            out.__dict__[fname] = _default_value(sub, dflt)
        for fname, sub, dflt in (self.tagged or {}).values():
            out.__dict__[fname] = _default_value(sub, dflt)
        return out

    def _parse(self, stream: Any, context: Any, path: str) -> Message:
        msg = Message()
        d = msg.__dict__
        for fname, sub, _ in self.plain:
            d[fname] = sub._parse(stream, context, path)
        if self.tagged is not None:
            for fname, sub, dflt in self.tagged.values():
                d[fname] = _default_value(sub, dflt)
            count = read_uvarint(stream)
            if count > _remaining(stream):
                raise CodecError(f"{self.struct_name}: {count} tagged fields in {_remaining(stream)} bytes")
            last = -1
            unknown: dict[int, bytes] = {}
            for _ in range(count):
                tag = read_uvarint(stream)
                if tag <= last:
                    raise CodecError(f"{self.struct_name}: tagged field {tag} out of order", where=stream.tell())
                last = tag
                size = read_uvarint(stream)
                if size > _remaining(stream):
                    raise CodecError(
                        f"{self.struct_name}: tagged field {tag} size {size} exceeds the bytes remaining",
                        where=stream.tell(),
                    )
                raw = stream.read(size)
                known = self.tagged.get(tag)
                if known is None:
                    unknown[tag] = raw
                    continue
                sub_stream = io.BytesIO(raw)
                d[known[0]] = known[1]._parse(sub_stream, context, path)
                if sub_stream.tell() != size:
                    raise CodecError(f"{self.struct_name}: tagged field {tag} has {size - sub_stream.tell()} "
                                     "trailing bytes")
            if unknown:
                d["unknown_tags"] = unknown
        return msg

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        d = obj.__dict__ if isinstance(obj, Message) else obj
        for fname, sub, dflt in self.plain:
            value = d.get(fname, _MISSING)
            sub._build(_default_value(sub, dflt) if value is _MISSING else value, stream, context, path)
        if self.tagged is not None:
            out: list[tuple[int, bytes]] = []
            for tag, (fname, sub, dflt) in self.tagged.items():
                value = d.get(fname, _MISSING)
                if value is _MISSING or value == _default_value(sub, dflt):
                    continue
                buf = io.BytesIO()
                sub._build(value, buf, context, path)
                out.append((tag, buf.getvalue()))
            unknown = d.get("unknown_tags")
            if unknown:
                out.extend(unknown.items())
                out.sort()
            stream.write(write_uvarint(len(out)))
            for tag, raw in out:
                stream.write(write_uvarint(tag))
                stream.write(write_uvarint(len(raw)))
                stream.write(raw)
        return obj


class NullableStruct(cs.Construct):
    """A nullable struct field (not an array): an int8 marker, -1 for null, then the struct when it is 1 (Kafka's
    generated ``read``/``write`` for a struct field with ``nullableVersions``; ConsumerGroupHeartbeatResponse's
    Assignment is null when it did not change)."""

    def __init__(self, struct: KafkaStruct) -> None:
        super().__init__()
        self.struct = struct

    def _parse(self, stream: Any, context: Any, path: str) -> Message | None:
        if _read(stream, 1, "nullable struct marker")[0] >= 0x80:
            return None
        return self.struct._parse(stream, context, path)

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        if obj is None:
            stream.write(b"\xff")
            return obj
        stream.write(b"\x01")
        return self.struct._build(obj, stream, context, path)


_MISSING = object()


def _default_value(sub: cs.Construct, dflt: Any) -> Any:
    if isinstance(sub, NullableStruct):
        return None  # Kafka's specs give nullable struct fields the default "null"
    if isinstance(sub, KafkaStruct) and dflt is None:
        return sub.default()
    if isinstance(dflt, list):
        return []
    return dflt


# --------------------------------------------------------------------------------------------- compiler

_FIXED = {
    "int8": ("b", "int8"),
    "int16": ("h", "int16"),
    "int32": ("i", "int32"),
    "int64": ("q", "int64"),
    "uint16": ("H", "uint16"),
    "uint32": ("I", "uint32"),
    "float64": ("d", "float64"),
}


def _primitive(f: FieldSpec, t: str, version: int, flexible: bool) -> cs.Construct:
    nullable = version in f.nullable
    if t in _FIXED:
        return Fixed(*_FIXED[t])
    if t == "bool":
        return Bool()
    if t == "uuid":
        return cs.Bytes(16)
    if t == "varint":
        return ZigZag(32)
    if t == "varlong":
        return ZigZag(64)
    if t == "string":
        return Sized("uvarint" if flexible else "int16", text=True, nullable=nullable, what=f.kafka_name)
    if t in ("bytes", "records"):
        return Sized("uvarint" if flexible else "int32", text=False, nullable=nullable, what=f.kafka_name)
    if t == "varstring":
        return Sized("varint", text=True, nullable=nullable, what=f.kafka_name)
    if t == "varbytes":
        return Sized("varint", text=False, nullable=nullable, what=f.kafka_name)
    raise CodecError(f"unknown field type {t!r} in field {f.kafka_name}")


def _field(f: FieldSpec, version: int, flexible: bool) -> cs.Construct:
    fflex = flexible and (f.flexible_override is None or version in f.flexible_override)
    if f.is_struct:
        element: cs.Construct = _struct(f.element_type, f.fields, version, fflex)
    else:
        element = _primitive(f, f.element_type, version, fflex)
    if not f.is_array:
        if f.is_struct and version in f.nullable:
            return NullableStruct(element)
        return element
    count = f.count_type or ("uvarint" if fflex else "int32")
    return Array(element, count, nullable=version in f.nullable, what=f.kafka_name)


def _struct(name: str, fields: tuple[FieldSpec, ...], version: int, flexible: bool) -> KafkaStruct:
    plain: list[tuple[str, cs.Construct, Any]] = []
    tagged: dict[int, tuple[str, cs.Construct, Any]] = {}
    for f in fields:
        if version not in f.versions:
            continue
        sub = _field(f, version, flexible)
        if flexible and version in f.tagged:
            if f.tag is None:
                raise CodecError(f"tagged field {f.kafka_name} has no tag")
            tagged[f.tag] = (f.name, sub, f.default)
        else:
            plain.append((f.name, sub, f.default))
    return KafkaStruct(name, plain, dict(sorted(tagged.items())) if flexible else None)


@cache
def struct_for(spec: MessageSpec, version: int) -> KafkaStruct:
    """The construct struct for ``spec`` at ``version`` (cached; specs are immutable)."""
    if version not in spec.valid:
        raise CodecError(f"version {version} outside {spec.name}'s valid range "
                         f"{spec.valid.low}-{spec.valid.high}", api=spec.name, version=version)
    return _struct(spec.name, spec.fields, version, version in spec.flexible)


@cache
def compiled_for(spec: MessageSpec, version: int) -> Codec:
    return Codec(spec, version, struct_for(spec, version))


@cache
def head_codec(spec: MessageSpec, version: int, last_field: str) -> Codec:
    """A codec for the leading fields of ``spec`` only, up to and including ``last_field``: what follows (and
    the message's tag section) stays bytes. Lets the proxy rewrite the head of a large message — Metadata's
    broker list comes before its topics — without decoding and re-encoding the rest."""
    names = [f.name for f in spec.fields if version in f.versions]
    if last_field not in names:
        raise CodecError(f"{spec.name} v{version} has no field {last_field!r}", api=spec.name, version=version)
    fields = tuple(f for f in spec.fields if version in f.versions)[: names.index(last_field) + 1]
    head = _struct(spec.name, fields, version, version in spec.flexible)
    if head.tagged:
        raise CodecError(f"{spec.name} v{version}: tagged fields before {last_field!r}", api=spec.name)
    head.tagged = None  # the message's tag section is at its end, in the bytes left alone
    return Codec(spec, version, head)


class Codec:
    """decode/encode for one (spec, version): bytes <-> Message, every failure a CodecError."""

    __slots__ = ("_parse", "_struct", "spec", "version")

    def __init__(self, spec: MessageSpec, version: int, st: KafkaStruct) -> None:
        self.spec = spec
        self.version = version
        self._struct = st
        self._parse: Callable[..., Message] = st._parse

    def default(self) -> Message:
        return self._struct.default()

    def default_of(self, *path: str) -> Message:
        """The default of the struct at ``path`` (field names, each an array of structs or a struct), e.g.
        ``default_of("topics", "partitions")``: a Fetch response's partition with every field at its default."""
        st: cs.Construct = self._struct
        for name in path:
            assert isinstance(st, KafkaStruct)
            fields = {fname: sub for fname, sub, _ in (*st.plain, *(st.tagged or {}).values())}
            if name not in fields:
                raise KeyError(f"{self.spec.name} v{self.version}: no field {name!r} in {st.struct_name}")
            st = fields[name]
            if isinstance(st, Array):
                st = st.element
        if not isinstance(st, KafkaStruct):
            raise KeyError(f"{self.spec.name} v{self.version}: {'.'.join(path)} is not a struct")
        return st.default()

    def decode_from(self, stream: io.BytesIO) -> Message:
        """Decode one struct from the stream's position (used for headers followed by a body)."""
        try:
            return self._parse(stream, _CTX, "")
        except CodecError as e:
            raise e.located(api=self.spec.name, version=self.version) from None
        except (cs.ConstructError, ValueError, struct.error, IndexError, OverflowError, MemoryError) as e:
            raise CodecError(f"{type(e).__name__}: {e}", where=stream.tell(),
                             api=self.spec.name, version=self.version) from None

    def decode(self, data: bytes | bytearray | memoryview, *, exact: bool = True) -> Message:
        """Decode ``data``; with ``exact`` (the default) trailing bytes are an error."""
        stream = io.BytesIO(data)
        msg = self.decode_from(stream)
        if exact and stream.tell() != len(data):
            raise CodecError(f"{len(data) - stream.tell()} trailing bytes", where=stream.tell(),
                             api=self.spec.name, version=self.version)
        return msg

    def encode_into(self, msg: Message, stream: io.BytesIO) -> None:
        try:
            self._struct._build(msg, stream, _CTX, "")
        except CodecError as e:
            raise e.located(api=self.spec.name, version=self.version) from None
        except (cs.ConstructError, TypeError, AttributeError, ValueError, struct.error, OverflowError) as e:
            raise CodecError(f"cannot encode: {type(e).__name__}: {e}",
                             api=self.spec.name, version=self.version) from None

    def encode(self, msg: Message) -> bytes:
        stream = io.BytesIO()
        self.encode_into(msg, stream)
        return stream.getvalue()


_CTX = cs.Container()


# ------------------------------------------------------------- skimming primitives (wire/skim.py, the fast paths)


def uvarint_at(buf: memoryview, pos: int) -> tuple[int, int]:
    """Kafka ByteUtils.readUnsignedVarint at ``pos`` (at most 5 bytes): (value, next position)."""
    b = buf[pos]  # IndexError past the end -> CodecError in decode()
    if b < 0x80:  # one byte: nearly every count and length a request or response carries
        return b, pos + 1
    value = 0
    shift = 0
    for i in range(pos, pos + 5):
        b = buf[i]  # IndexError past the end -> CodecError in decode()
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    raise CodecError("varint longer than 5 bytes", where=pos)


def tag_section_at(buf: memoryview, pos: int, n: int) -> tuple[memoryview | None, int]:
    """A tag section at ``pos``: (its raw bytes incl. the count, or None when it is empty, next position).

    Checked like KafkaStruct._parse: ascending tags, sizes within the frame."""
    count = buf[pos]
    if count == 0:
        return None, pos + 1
    start = pos
    if count < 0x80:
        pos += 1
    else:
        count, pos = uvarint_at(buf, pos)
    if count > n - pos:
        raise CodecError(f"{count} tagged fields in {n - pos} bytes", where=pos)
    last = -1
    for _ in range(count):
        tag, pos = uvarint_at(buf, pos)
        if tag <= last:
            raise CodecError(f"tagged field {tag} out of order", where=pos)
        last = tag
        size, pos = uvarint_at(buf, pos)
        if size > n - pos:
            raise CodecError(f"tagged field {tag} size {size} exceeds the {n - pos} bytes remaining", where=pos)
        pos += size
    return buf[start:pos], pos


def skip_tags(buf: memoryview, pos: int) -> int:
    """Past a KIP-482 tagged-field section at ``pos`` (validated like KafkaStruct._parse)."""
    return tag_section_at(buf, pos, len(buf))[1]
