"""The one exception every codec raises on malformed input.

Kafka's own readers (org.apache.kafka.common.protocol.ByteBufferAccessor, MessageUtil) fail with a
single exception type for any malformed frame; Sluice does the same so the server can confine a bad frame
to its connection with one ``except CodecError`` instead of guessing at IndexError, struct.error and friends.
"""

from __future__ import annotations


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
