"""The PROXY protocol header a load balancer puts in front of a client's bytes (HAProxy's "The PROXY protocol",
versions 1 and 2), parsed sans-IO: bytes in, the client's real address (or a need for more bytes, or an error)
out. :mod:`proxy.io.listeners` reads the header off the accepted socket before anything else (before TLS: the header
travels in clear ahead of the handshake) and hands the rest of the connection to the usual path.

Rules followed (spec sections in brackets):

- v1 [2.1]: one ASCII line ``PROXY <TCP4|TCP6|UNKNOWN> <src> <dst> <sport> <dport>\\r\\n``, at most 107 bytes
  including the CRLF; with ``UNKNOWN`` the rest of the line is ignored and the connection's own addresses apply.
- v2 [2.2]: the 12-byte signature, a version/command byte (version 2; command LOCAL = 0, the balancer's own
  health check: the connection's own addresses apply; PROXY = 1), an address family/transport byte, a 16-bit
  length of what follows (addresses, then TLVs, which are skipped). AF_INET carries 4+4+2+2 bytes, AF_INET6
  16+16+2+2; AF_UNSPEC (and AF_UNIX, which has no host:port) keep the connection's own addresses.
- A receiver must not guess [2]: when a listener expects a header, anything else in its place is an error and
  the connection is closed; a header of a version the listener does not accept is an error too.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Literal

__all__ = ["V1_MAX", "V2_SIGNATURE", "NeedMore", "ProxyHeader", "ProxyProtocolError", "Versions", "parse"]

#: the v2 signature [2.2]
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
#: the longest v1 line, CRLF included [2.1]
V1_MAX = 107
_V2_FIXED = 16
_AF_INET, _AF_INET6 = 0x1, 0x2
_V2_HEAD = struct.Struct(">BBH")

Versions = Literal["v1", "v2", "any"]


class ProxyProtocolError(ValueError):
    """Not a PROXY header where one is required (the message says what was wrong, never echoes much input)."""


@dataclass(frozen=True, slots=True)
class NeedMore:
    """The header is incomplete: at least ``total`` bytes (from the start) are needed to go on."""

    total: int


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A complete header: ``length`` bytes long; ``source``/``destination`` are None when the header carries no
    address (v1 UNKNOWN, v2 LOCAL or AF_UNSPEC/AF_UNIX): the connection's own addresses then apply."""

    version: int
    length: int
    source: tuple[str, int] | None = None
    destination: tuple[str, int] | None = None


def parse(data: bytes | bytearray | memoryview, versions: Versions = "any") -> ProxyHeader | NeedMore:
    """Parse the header at the start of ``data``. ProxyProtocolError if it is not one (of an accepted version)."""
    data = bytes(data[: max(V1_MAX, _V2_FIXED + 65535)])
    if not data:
        return NeedMore(8)
    if data[:1] == b"\r":
        want = V2_SIGNATURE[: len(data)]
        if data[: len(V2_SIGNATURE)] != want:
            raise ProxyProtocolError("not a PROXY protocol v2 signature")
        if versions == "v1":
            raise ProxyProtocolError("a PROXY protocol v2 header on a listener that accepts v1 only")
        return _parse_v2(data)
    if data[:1] == b"P":
        if not b"PROXY "[: len(data)] == data[:6]:
            raise ProxyProtocolError("not a PROXY protocol header")
        if versions == "v2":
            raise ProxyProtocolError("a PROXY protocol v1 header on a listener that accepts v2 only")
        return _parse_v1(data)
    raise ProxyProtocolError("the connection did not start with a PROXY protocol header")


def _parse_v1(data: bytes) -> ProxyHeader | NeedMore:
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX:
            raise ProxyProtocolError(f"PROXY v1 line longer than {V1_MAX} bytes")
        return NeedMore(len(data) + 1)
    try:
        line = data[:end].decode("ascii")
    except UnicodeDecodeError:
        raise ProxyProtocolError("PROXY v1 line is not ASCII") from None
    parts = line.split(" ")
    if len(parts) < 2:
        raise ProxyProtocolError("PROXY v1 line without a protocol")
    proto = parts[1]
    if proto == "UNKNOWN":
        return ProxyHeader(1, end + 2)
    if proto not in ("TCP4", "TCP6") or len(parts) != 6:
        raise ProxyProtocolError("PROXY v1 line is not 'PROXY TCP4|TCP6 src dst sport dport'")
    src, dst = _v1_address(parts[2], proto), _v1_address(parts[3], proto)
    return ProxyHeader(1, end + 2, (src, _v1_port(parts[4])), (dst, _v1_port(parts[5])))


def _v1_address(text: str, proto: str) -> str:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyProtocolError("PROXY v1 address is not an IP address") from None
    if (addr.version == 4) != (proto == "TCP4"):
        raise ProxyProtocolError(f"PROXY v1 address family does not match {proto}")
    return str(addr)


def _v1_port(text: str) -> int:
    # [2.1]: ports are decimal 0..65535 without leading zeros (a "0" alone is fine)
    if not text.isdigit() or (len(text) > 1 and text[0] == "0") or int(text) > 65535:
        raise ProxyProtocolError("PROXY v1 port is not a number 0..65535")
    return int(text)


def _parse_v2(data: bytes) -> ProxyHeader | NeedMore:
    if len(data) < _V2_FIXED:
        return NeedMore(_V2_FIXED)
    ver_cmd, fam, length = _V2_HEAD.unpack_from(data, 12)
    if ver_cmd >> 4 != 2:
        raise ProxyProtocolError("PROXY v2 header with a version other than 2")
    command = ver_cmd & 0x0F
    if command not in (0, 1):
        raise ProxyProtocolError("PROXY v2 header with an unknown command")
    total = _V2_FIXED + length
    if len(data) < total:
        return NeedMore(total)
    if command == 0:  # LOCAL: the balancer's own connection (health checks)
        return ProxyHeader(2, total)
    family = fam >> 4
    body = data[_V2_FIXED:total]
    if family == _AF_INET:
        if length < 12:
            raise ProxyProtocolError("PROXY v2 AF_INET header shorter than its addresses")
        src, dst = (str(ipaddress.IPv4Address(body[i : i + 4])) for i in (0, 4))
        sport, dport = struct.unpack_from(">HH", body, 8)
        return ProxyHeader(2, total, (src, sport), (dst, dport))
    if family == _AF_INET6:
        if length < 36:
            raise ProxyProtocolError("PROXY v2 AF_INET6 header shorter than its addresses")
        src, dst = (str(ipaddress.IPv6Address(body[i : i + 16])) for i in (0, 16))
        sport, dport = struct.unpack_from(">HH", body, 32)
        return ProxyHeader(2, total, (src, sport), (dst, dport))
    return ProxyHeader(2, total)  # AF_UNSPEC, AF_UNIX: no host:port to report
