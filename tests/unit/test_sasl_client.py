"""Sluice's own SASL client (proxy/core/sasl_client.py) against RFC 7677's SCRAM-SHA-256 example exchange, and
what it refuses."""

from __future__ import annotations

import pytest

from proxy.core.sasl_client import SaslClient, SaslClientError

# RFC 7677 section 3: user "user", password "pencil"
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_sha_256_matches_the_rfc_7677_example() -> None:
    client = SaslClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == CLIENT_FIRST
    assert client.next(SERVER_FIRST) == CLIENT_FINAL
    assert client.next(SERVER_FINAL) is None  # the server's signature verifies


def test_scram_refuses_a_server_that_does_not_know_the_password() -> None:
    client = SaslClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    client.first()
    client.next(SERVER_FIRST)
    with pytest.raises(SaslClientError, match="signature"):
        client.next(b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
    other = SaslClient("SCRAM-SHA-512", "user", "pencil", nonce="abc")
    other.first()
    with pytest.raises(SaslClientError, match="server-first"):
        other.next(b"r=xyz,s=c2FsdA==,i=4096")  # the server's nonce must extend the client's


def test_plain_is_one_message_and_usernames_are_escaped() -> None:
    plain = SaslClient("PLAIN", "svc", "pw")
    assert plain.first() == b"\0svc\0pw" and plain.next(b"") is None
    assert SaslClient("SCRAM-SHA-512", "a,b=c", "pw", nonce="n").first() == b"n,,n=a=2Cb=3Dc,r=n"
