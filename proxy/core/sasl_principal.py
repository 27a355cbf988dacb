"""Who authenticated on a connection: the principal's *name* read from a SASL exchange Sluice relays untouched.

Sans-IO. Sluice never stores, logs or checks a credential: from each client message it keeps only the name (the
functions below return a name or None, nothing else), and the broker alone decides whether the authentication
succeeds. Which name each mechanism carries, and where:

- PLAIN (RFC 4616 section 2): ``[authzid] NUL authcid NUL passwd``. Kafka's PlainSaslServer authenticates authcid
  and accepts an authzid only when it equals authcid, so the principal is authzid when given, else authcid.
- SCRAM-SHA-256/512 (RFC 5802 section 5.1, 7; KIP-84): the client-first-message is a GS2 header (``n,,`` /
  ``y,,`` / ``p=...,`` optionally with ``a=authzid``) and ``n=saslname,r=nonce[,...]``; saslname escapes ``,``
  as ``=2C`` and ``=`` as ``=3D``. Kafka's ScramSaslServer uses the ``n=`` user (an authzid must equal it).
- OAUTHBEARER (RFC 7628 section 3.1; KIP-255): the initial client response is a GS2 header, then
  ``\\x01``-separated ``key=value`` pairs, among them ``auth=Bearer <token>``. The token is a JWT (RFC 7519): its
  payload's ``sub`` claim is the principal Kafka's default (unsecured) validator takes. Sluice reads the payload
  *without verifying the signature*: the broker verifies the token; Sluice only names the connection after the
  broker accepted it.

The name is adopted only when the broker says the exchange succeeded (:meth:`SaslExchange.response`): PLAIN and
OAUTHBEARER in one round (a successful OAUTHBEARER answer carries no bytes; a non-empty one is the KIP-255 error
challenge), SCRAM in two (the server-final-message ``v=...``, RFC 5802 section 7). Re-authentication (KIP-368)
is the same exchange again on the open connection; Kafka refuses a different principal then, so a success keeps
the name (and would take a new one should a broker ever allow it).

GSSAPI's tokens carry no name Sluice can read without Kerberos: such connections keep no principal.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable

__all__ = ["MECHANISMS", "SaslExchange", "oauthbearer_principal", "plain_principal", "scram_principal"]

#: the longest name Sluice keeps (a principal is a selector and a log field, never a blob)
MAX_NAME = 256


def _name(raw: bytes | str) -> str | None:
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        return None
    if not text or len(text) > MAX_NAME or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return None
    return text


def plain_principal(message: bytes) -> str | None:
    """RFC 4616: the authzid if present, else the authcid; None if the message is not PLAIN's form. The
    password is never looked at beyond splitting it off."""
    parts = message.split(b"\x00")
    if len(parts) != 3:
        return None
    authzid, authcid = parts[0], parts[1]
    return _name(authzid) if authzid else _name(authcid)


def _gs2_authzid(header: str) -> str | bool | None:
    """The authzid of a GS2 header (RFC 5801 section 4: ``cbind-flag,[a=authzid],``), None when absent, False
    when the header is malformed."""
    fields = header.split(",")
    if len(fields) != 2 or not fields[0] or fields[0][0] not in "nyp":
        return False
    if not fields[1]:
        return None
    if not fields[1].startswith("a="):
        return False
    return _unescape_saslname(fields[1][2:])


def _unescape_saslname(text: str) -> str | None:
    """RFC 5802 section 5.1: ``=2C`` is ``,``, ``=3D`` is ``=``; any other ``=`` makes the name invalid."""
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "=":
            code = text[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                return None
            i += 3
            continue
        out.append(c)
        i += 1
    return "".join(out)


def scram_principal(client_first: bytes) -> str | None:
    """RFC 5802: the ``n=`` user of a client-first-message (the authzid if one is given)."""
    try:
        text = client_first.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # gs2-header is two comma-terminated fields; the bare message follows
    first = text.find(",")
    second = text.find(",", first + 1) if first >= 0 else -1
    if second < 0:
        return None
    authzid = _gs2_authzid(text[:second])
    if authzid is False:
        return None
    bare = text[second + 1 :]
    if not bare.startswith("n="):
        return None
    user = _unescape_saslname(bare[2:].split(",", 1)[0])
    if user is None:
        return None
    return _name(authzid if isinstance(authzid, str) and authzid else user)


def oauthbearer_principal(initial: bytes) -> str | None:
    """RFC 7628 + RFC 7519: the ``sub`` claim of the bearer token's (unverified) payload."""
    try:
        text = initial.decode("utf-8")
    except UnicodeDecodeError:
        return None
    header, sep, rest = text.partition("\x01")
    # the GS2 header ends with its own comma ("n,," or "n,a=user,")
    if not sep or not header.endswith(",") or _gs2_authzid(header[:-1]) is False:
        return None
    token = None
    for pair in rest.split("\x01"):
        key, eq, value = pair.partition("=")
        if eq and key == "auth" and value[:7].lower() == "bearer ":
            token = value[7:].strip()
    if token is None:
        return None
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    sub = payload.get("sub") if isinstance(payload, dict) else None
    return _name(sub) if isinstance(sub, str) else None


#: mechanism (as the client names it in SaslHandshake) -> how its first client message names the principal
MECHANISMS: dict[str, Callable[[bytes], str | None]] = {
    "PLAIN": plain_principal,
    "SCRAM-SHA-256": scram_principal,
    "SCRAM-SHA-512": scram_principal,
    "OAUTHBEARER": oauthbearer_principal,
}


class SaslExchange:
    """One connection's SASL exchanges (KIP-43 SaslHandshake, then SaslAuthenticate rounds, or after a v0
    handshake bare tokens; again for each KIP-368 re-authentication). Feed it what passes; :attr:`principal` is
    the name once the broker accepted."""

    __slots__ = ("_candidate", "_mechanism", "_round", "principal")

    def __init__(self) -> None:
        self.principal: str | None = None
        self._mechanism: str | None = None
        self._candidate: str | None = None
        self._round = 0

    def handshake(self, mechanism: str) -> None:
        """SaslHandshake: a new exchange starts (the first, or a re-authentication)."""
        self._mechanism = mechanism.upper()
        self._candidate = None
        self._round = 0

    def request(self, auth_bytes: bytes) -> None:
        """A SaslAuthenticate request: the first one names the principal."""
        self._round += 1
        if self._round == 1 and self._mechanism is not None:
            read = MECHANISMS.get(self._mechanism)
            self._candidate = read(auth_bytes) if read is not None else None

    def response(self, error_code: int, auth_bytes: bytes) -> bool:
        """A SaslAuthenticate response. True when it completed a successful exchange (the principal is set)."""
        mech = self._mechanism
        if error_code != 0 or mech is None or self._candidate is None:
            return False
        if mech.startswith("SCRAM-"):
            done = auth_bytes.startswith(b"v=")  # server-final-message (RFC 5802 section 7)
        elif mech == "OAUTHBEARER":
            done = not auth_bytes  # a non-empty answer is the KIP-255 error challenge
        else:
            done = True
        if done:
            self.principal = self._candidate
            self._mechanism = None
        return done
