"""The decoded-message model: plain objects with attribute access, equal when their fields are equal.

A decoded struct carries exactly the fields its (api, version) has, under snake_case names
(``resp.responses[0].partitions[0].high_watermark``). Tagged fields the spec does not know are kept in
``unknown_tags`` ({tag: raw bytes}) only when present, so a frame re-encodes byte-exact. Tests build
messages by keyword; fields left out take the spec's default when encoded.
"""

from __future__ import annotations

from typing import Any

#: a partition named by its topic's name, as group offsets and assignments name it
TopicPartition = tuple[str, int]


class Message:
    """One Kafka struct (a request/response body, a header, or a nested struct)."""

    __slots__ = ("__dict__",)

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and self.__dict__ == other.__dict__

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__[name] = value

    def __getattr__(self, name: str) -> Any:
        # Only reached when the attribute is missing: say which fields exist.
        raise AttributeError(f"message has no field {name!r}; fields: {sorted(self.__dict__)}")

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"Message({inner})"

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)

    def fields(self) -> dict[str, Any]:
        return self.__dict__

    def replace(self, **changes: Any) -> Message:
        """A shallow copy with some fields changed (policies never mutate a decoded message in place)."""
        copy = Message(**self.__dict__)
        copy.__dict__.update(changes)
        return copy
