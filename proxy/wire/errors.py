"""The one exception every codec raises on malformed input.

Kafka's own readers (org.apache.kafka.common.protocol.ByteBufferAccessor, MessageUtil) fail with a
single exception type for any malformed frame; Sluice does the same so the server can confine a bad frame
to its connection with one ``except CodecError`` instead of guessing at IndexError, struct.error and friends.
"""

from __future__ import annotations

import struct


class CodecError(ValueError):
    """Malformed or unsupported wire data.

    ``what`` says what was wrong, ``where`` the byte offset (or field path) at which it was found, and
    ``api``/``version`` which message was being decoded or encoded, when known.
    """

    def __init__(
        self,
        what: str,
        *,
        where: str | int | None = None,
        api: str | int | None = None,
        version: int | None = None,
    ) -> None:
        self.what = what
        self.where = where
        self.api = api
        self.version = version
        parts = [what]
        if api is not None:
            parts.append(f"api={api}" + (f" v{version}" if version is not None else ""))
        if where is not None:
            parts.append(f"at {where}")
        super().__init__(" ".join(parts))

    def located(self, *, api: str | int | None, version: int | None) -> CodecError:
        """The same error, annotated with the message being processed (kept if already set)."""
        return CodecError(
            self.what,
            where=self.where,
            api=self.api if self.api is not None else api,
            version=self.version if self.version is not None else version,
        )


class MalformedFrame(CodecError):
    """The frame being read is malformed: raised by the request views a policy reads (``proxy.wire.views``), so that
    the chain can tell a client's malformed frame (rejected as such) from a CodecError a policy's own parsing or
    encoding raised (that policy's failure)."""


class codec_errors:  # a lower-case name: used as a function, ``with codec_errors(...):``
    """Around a hand-written decoder (the fast paths): what malformed input makes Python raise there
    (struct.error / IndexError past the end, bad UTF-8, a size Python cannot allocate) becomes one CodecError
    naming ``what`` was being decoded; a CodecError raised inside is annotated with the message. A class, not a
    generator-based context manager: it runs on every Produce request (wire/produce.py), and entering a class's
    ``__enter__``/``__exit__`` costs a fraction of a generator's set-up."""

    __slots__ = ("api", "version", "what")

    def __init__(self, what: str, *, api: str | int, version: int) -> None:
        self.what = what
        self.api = api
        self.version = version

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        if e is None:
            return
        if isinstance(e, MALFORMED):
            raise as_codec_error(e, self.what, api=self.api, version=self.version) from None


#: what malformed input makes Python raise in a hand-written decoder (see :class:`codec_errors`)
MALFORMED = (CodecError, struct.error, IndexError, ValueError, OverflowError, MemoryError)


def as_codec_error(e: BaseException, what: str, *, api: str | int, version: int) -> CodecError:
    """The CodecError one of :data:`MALFORMED` stands for, naming ``what`` was being decoded. For the hottest
    decoder (a Produce request's acks, on every producer's request) a ``try``/``except MALFORMED`` around it,
    free until it fires, in place of entering :class:`codec_errors`."""
    if isinstance(e, CodecError):
        return e.located(api=api, version=version)
    if isinstance(e, (struct.error, IndexError)):
        return CodecError(f"truncated {what}", api=api, version=version)
    if isinstance(e, UnicodeDecodeError):
        return CodecError(f"{what}: string is not valid UTF-8", api=api, version=version)
    return CodecError(f"{type(e).__name__}: {e}", api=api, version=version)
