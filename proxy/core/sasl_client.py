"""Sluice's own SASL client, for the requests Sluice makes itself (its Metadata lookups of brokers and topic
names, its group requests) to brokers whose listener requires SASL: ``[upstream.sasl]``, a service account of
Sluice's, never a client's credentials (those are only relayed: :mod:`proxy.policies.sasl`). Sans-IO: messages
in, messages out.

- PLAIN (RFC 4616): one message, ``NUL user NUL password``.
- SCRAM-SHA-256/512 (RFC 5802, RFC 7677; KIP-84): client-first ``n,,n=user,r=nonce``; from the server-first
  (``r=nonce+server,s=salt,i=iterations``) the client-final with its proof; the server-final's signature is
  checked, so a server that does not know the password is not believed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

__all__ = ["SaslClient", "SaslClientError"]


class SaslClientError(Exception):
    """The server's answer is not what the mechanism allows (never carries a credential)."""


def _escape(name: str) -> str:
    # RFC 5802 section 5.1: "," and "=" in a saslname
    return name.replace("=", "=3D").replace(",", "=2C")


class SaslClient:
    """One authentication: :meth:`first`, then :meth:`next` with each server message until it returns None."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self._user = username
        self._password = password
        self._nonce = nonce or base64.b64encode(secrets.token_bytes(18)).decode()
        self._hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}.get(mechanism)
        self._bare = ""
        self._server_signature = b""
        self._step = 0

    def first(self) -> bytes:
        self._step = 1
        if self.mechanism == "PLAIN":
            return f"\0{self._user}\0{self._password}".encode()
        if self._hash is None:
            raise SaslClientError(f"unsupported mechanism {self.mechanism}")
        self._bare = f"n={_escape(self._user)},r={self._nonce}"
        return f"n,,{self._bare}".encode()

    def next(self, server: bytes) -> bytes | None:
        """The reply to a server message, or None when the exchange is complete."""
        if self.mechanism == "PLAIN" or self._step == 2:
            if self._step == 2:
                self._verify(server)
            self._step = 3
            return None
        self._step = 2
        return self._final(server)

    def _final(self, server_first: bytes) -> bytes:
        assert self._hash is not None
        text = server_first.decode("utf-8", "replace")
        attrs = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or not salt or not iterations.isdigit():
            raise SaslClientError("the SCRAM server-first-message is not valid")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password.encode(), base64.b64decode(salt), int(iterations))
        client_key = hmac.digest(salted, b"Client Key", self._hash)
        stored = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = hmac.digest(stored, auth_message, self._hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self._hash)
        self._server_signature = hmac.digest(server_key, auth_message, self._hash)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _verify(self, server_final: bytes) -> None:
        text = server_final.decode("utf-8", "replace")
        if not text.startswith("v=") or not hmac.compare_digest(base64.b64decode(text[2:]), self._server_signature):
            raise SaslClientError("the SCRAM server signature does not verify")
