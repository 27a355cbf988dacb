"""Skimming a message: where its top-level tag section starts, found without decoding it.

KIP-951 put broker addresses into a top-level tagged field of Fetch (v16+) and Produce (v10+) responses,
NodeEndpoints, which the broker fills only after a partition's leader moved. Sluice must rewrite them, yet decoding
every response to look at its last bytes is most of what it would add to a round trip. So the fields are skimmed:
lengths and counts read, nothing decoded, and the top-level tag section found; when it is empty (one zero byte)
nothing in the response needs Sluice, and it is relayed as bytes, unread (``Exchange.relay_if``). The Produce
response's ThrottleTimeMs sits just before that section (proxy/wire/throttle_time.py).

The skim is generated from the message spec, like every codec here (a new field or version is a spec change):
:func:`top_level_tags_locator` writes one straight-line Python function per (spec, version) - adjacent
fixed-size fields folded into one offset step, one-byte varints read inline, nested tag sections stepped over
in one test when empty - and compiles it once. Against closures per field it is about three times faster
(bench: a Produce response skimmed in ~1.2 us instead of ~3.5 us), and Sluice runs it on every producer's
request: as :func:`top_level_tags_empty`, the whole test (the response header stepped over, the fields skimmed,
the tag section's first byte read) in one function. Arrays are counted down in place, not iterated over a range.

A producer's responses mostly come in a few shapes (the same topics and partitions, the same lengths), and a skim's
outcome depends only on the frame's length and the bytes it reads - the counts, lengths and tag markers - never on
the offsets and times between them. So :func:`shape_memo` keeps, per frame length, the positions a skim read and
their values: a later frame of that length with the same values there would take the skim down the same path to the
same outcome, and gets it from one ``itemgetter`` call and a tuple comparison (~20 bytecodes instead of ~175 for a
one-partition Produce response, every producer's round trip).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import cache
from operator import itemgetter
from typing import Any

from .compiler import skip_tags, uvarint_at
from .errors import CodecError
from .schema import FieldSpec, MessageSpec

#: wire sizes of the fixed-size types (Kafka's message specs: Types.java)
FIXED_SIZE = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint16": 2, "uint32": 4, "float64": 8, "bool": 1,
              "uuid": 16}

#: (buffer, body offset) -> offset of the body's top-level tag section; CodecError if the body is malformed
Locate = Callable[[bytes | bytearray | memoryview, int], int]


class _Writer:
    """The generated function's source, line by line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._names = 0
        self._step = 0  # fixed-size bytes not yet added to pos

    def emit(self, depth: int, line: str) -> None:
        self.flush(depth)
        self.lines.append("    " * depth + line)

    def advance(self, n: int) -> None:
        self._step += n

    def flush(self, depth: int) -> None:
        if self._step:
            step, self._step = self._step, 0
            self.lines.append("    " * depth + f"pos += {step}")

    def name(self) -> str:
        self._names += 1
        return f"n{self._names}"

    def tags(self, depth: int) -> None:
        """Past a nested tag section (one zero byte when empty)."""
        self.emit(depth, "if buf[pos]:")
        self.emit(depth + 1, "pos = skip_tags(buf, pos)")
        self.emit(depth, "else:")
        self.emit(depth + 1, "pos += 1")


def _struct(w: _Writer, fields: tuple[FieldSpec, ...], version: int, flexible: bool, depth: int) -> None:
    """Past one struct's fields at ``version`` (tagged ones live in its tag section), not its tag section."""
    for f in fields:
        if version not in f.versions or (flexible and version in f.tagged):
            continue
        fflex = flexible and (f.flexible_override is None or version in f.flexible_override)
        if f.is_array:
            _array(w, f, version, fflex, depth)
        else:
            _element(w, f, version, fflex, depth)


def _array(w: _Writer, f: FieldSpec, version: int, flexible: bool, depth: int) -> None:
    n = w.name()
    if flexible:
        # compact arrays: length + 1, 0 = null (the one-byte case inline, the count taken as it is read)
        w.emit(depth, f"{n} = buf[pos] - 1")
        w.emit(depth, f"if {n} < 0x7F:")
        w.emit(depth + 1, "pos += 1")
        w.emit(depth, "else:")
        w.emit(depth + 1, f"{n}, pos = uvarint_at(buf, pos)")
        w.emit(depth + 1, f"{n} -= 1")
    else:
        w.emit(depth, f"{n} = _I32(buf, pos)[0]")
        w.advance(4)
    size = FIXED_SIZE.get(f.element_type)
    if size is not None:
        w.emit(depth, f"if {n} > 0:")
        w.emit(depth + 1, f"pos += {n} * {size}")
        return
    # every element takes at least one byte: a count beyond the bytes left is malformed, not a long loop
    w.emit(depth, f"if {n} > end - pos:")
    w.emit(depth + 1, "raise IndexError")
    # counted down in place: a range object per array (three per Produce response) costs more than the loop
    w.emit(depth, f"while {n} > 0:")
    w.emit(depth + 1, f"{n} -= 1")
    _element(w, f, version, flexible, depth + 1)
    w.flush(depth + 1)


def _element(w: _Writer, f: FieldSpec, version: int, flexible: bool, depth: int) -> None:
    t = f.element_type
    if f.is_struct:
        nullable = not f.is_array and version in f.nullable
        if nullable:
            # an int8 marker, -1 for null, then the struct when it is 1 (compiler.py's NullableStruct)
            w.emit(depth, "if buf[pos] < 0x80:")
            w.emit(depth + 1, "pos += 1")
            depth += 1
        _struct(w, f.fields, version, flexible, depth)
        if flexible:
            w.tags(depth)
        w.flush(depth)
        if nullable:
            w.emit(depth - 1, "else:")
            w.emit(depth, "pos += 1")
    elif t in FIXED_SIZE:
        w.advance(FIXED_SIZE[t])
    elif t in ("string", "bytes", "records"):
        n = w.name()
        if flexible:
            # compact: length + 1, 0 = null; one varint byte and the bytes (n - 1) come to n, a null to 1
            w.emit(depth, f"{n} = buf[pos]")
            w.emit(depth, f"if {n} < 0x80:")
            w.emit(depth + 1, f"pos += {n} or 1")
            w.emit(depth, "else:")
            w.emit(depth + 1, f"{n}, pos = uvarint_at(buf, pos)")
            w.emit(depth + 1, f"pos += {n} - 1")
        else:
            unpack, width = ("_I16", 2) if t == "string" else ("_I32", 4)
            w.emit(depth, f"{n} = {unpack}(buf, pos)[0]")
            w.emit(depth, f"pos += {width}")
            w.emit(depth, f"if {n} > 0:")
            w.emit(depth + 1, f"pos += {n}")
    else:
        raise CodecError(f"cannot skim field type {t!r} ({f.kafka_name})")


#: a response frame (no size prefix) -> the body's body offset, for a response header of version 1
BodyAt = Callable[[bytes | bytearray | memoryview], int]
#: a response frame (no size prefix) -> whether the body's top-level tag section is empty
TagsEmpty = Callable[[bytes | bytearray | memoryview], bool]


@cache
def top_level_tags_locator(spec: MessageSpec, version: int) -> Locate:
    """For a flexible (spec, version): a function (buffer, body offset) -> offset of the body's top-level tag
    section (see the module docstring). Malformed input raises CodecError."""
    locate: Locate = _generate(spec, version, "locate(buf, pos)", [], "return pos", None)  # type: ignore[assignment]
    return locate


def top_level_tags_empty(spec: MessageSpec, version: int, body_at: BodyAt | None) -> TagsEmpty:
    """For a flexible (spec, version): a function (response frame, no size prefix) -> whether the body's top-level
    tag section is empty, in one generated function (on every producer's request: a call less than the locator's).
    ``body_at``: where the body starts after a response header v1 (called only when the header's tag section is
    not the one zero byte it nearly always is); None: header v0 (the body right after the correlation id). Callers
    keep what it returns (:func:`proxy.wire.views.tags_empty` caches it per API version)."""
    first = "pos = 4" if body_at is None else "pos = 5 if end > 4 and buf[4] == 0 else BODY_AT(buf)"
    empty: TagsEmpty = _generate(spec, version, "empty(buf)", [first], "return buf[pos] == 0",  # type: ignore[assignment]
                                 body_at)
    return empty


def _generate(spec: MessageSpec, version: int, signature: str, prologue: list[str], result: str,
              body_at: BodyAt | None) -> object:
    """The skim's function: ``signature``, the ``prologue`` lines (inside its try: a truncated frame is malformed),
    the fields skimmed from ``pos`` to the top-level tag section, then ``result``."""
    if version not in spec.flexible:
        raise CodecError(f"{spec.name} v{version} is not a flexible version", api=spec.name, version=version)
    w = _Writer()
    _struct(w, spec.fields, version, True, 2)
    w.flush(2)
    source = "\n".join([
        f"def {signature}:",
        "    end = len(buf)",
        "    try:",
        "        pass",
        *("        " + line for line in prologue),
        *w.lines,
        "    except (IndexError, StructError):",
        "        raise CodecError('truncated message while skimming', api=API, version=VERSION) from None",
        "    if pos >= end:",
        "        raise CodecError('message ends before its tag section', api=API, version=VERSION)",
        f"    {result}",
    ])
    namespace = {"uvarint_at": uvarint_at, "skip_tags": skip_tags, "_I16": struct.Struct(">h").unpack_from,
                 "_I32": struct.Struct(">i").unpack_from, "StructError": struct.error, "CodecError": CodecError,
                 "API": spec.name, "VERSION": version, "BODY_AT": body_at}
    exec(compile(source, f"<skim {spec.name} v{version}>", "exec"), namespace)  # the source written above
    return namespace[signature.split("(")[0]]


#: frame lengths :func:`shape_memo` keeps shapes of, per skim; when full it starts again
SHAPES_KEPT = 64
#: shapes kept per frame length: frames of one length rarely come in more than one or two shapes
SHAPES_PER_LENGTH = 4
#: a shape of more positions read is not kept (a response of hundreds of partitions: its skim is small beside it,
#: and its positions would be kept for nothing if it does not come again)
MAX_POSITIONS = 256


class _Noted:
    """A frame whose reads are noted: the positions a skim read (a slice: every position in it)."""

    __slots__ = ("_buf", "read")

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self._buf = buf
        self.read: set[int] = set()

    def __len__(self) -> int:
        return len(self._buf)

    def __getitem__(self, i: Any) -> Any:
        value = self._buf[i]  # IndexError past the end, as the skim expects
        if isinstance(i, slice):
            self.read.update(range(*i.indices(len(self._buf))))
        else:
            self.read.add(i % len(self._buf))
        return value


def shape_memo(skim: TagsEmpty) -> TagsEmpty:
    """``skim`` (a :func:`top_level_tags_empty` function) answering from the shapes it has seen (module docstring):
    the same answers, and the same CodecError for a malformed frame, as ``skim`` itself.

    Why it is exact: the skim is straight-line code whose every branch and every position it reads next follows
    from the frame's length and the bytes it has read so far; a frame of the same length with the same bytes at
    the positions it read is skimmed along the same path, position by position, to the same outcome. A frame
    found malformed is never kept (the skim raised before any shape was noted).

    What it costs when shapes do not repeat: a length seen once is only noted, and its shape noted (a second skim,
    through :class:`_Noted`) when the length comes again; a length whose shapes cannot be kept (more than
    ``MAX_POSITIONS`` read, more than ``SHAPES_PER_LENGTH`` shapes, a read the note cannot follow) is skimmed as
    without the memo from then on, until the memo starts again (``SHAPES_KEPT`` lengths). So frames whose shapes
    never repeat cost one skim each, plus a dictionary look-up, and at most two noted skims per length."""
    shapes: dict[int, list[tuple[Callable[[Any], Any], Any, bool]]] = {}
    unkept: list[tuple[Callable[[Any], Any], Any, bool]] = []  # the mark of a length skimmed as without the memo

    def empty(buf: bytes | bytearray | memoryview) -> bool:
        n = len(buf)
        kept = shapes.get(n)
        if kept:
            for get, seen, result in kept:
                if get(buf) == seen:
                    return result
        result = skim(buf)  # CodecError: malformed, nothing kept
        if kept is None:
            if len(shapes) >= SHAPES_KEPT:
                shapes.clear()
            shapes[n] = []  # seen once: its shape is noted when the length comes again
            return result
        if kept is unkept:
            return result
        noted = _Noted(buf)
        try:
            again = skim(noted)  # type: ignore[arg-type]
        except TypeError:  # a read the note cannot follow (a non-empty response header tag section)
            shapes[n] = unkept
            return result
        assert again is result
        if len(noted.read) > MAX_POSITIONS or len(kept) >= SHAPES_PER_LENGTH:
            shapes[n] = unkept
            return result
        get = itemgetter(*sorted(noted.read))
        kept.append((get, get(buf), result))
        return result

    return empty
