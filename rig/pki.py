"""A throwaway PKI for tests, benches and `make run`: a CA and the certificates signed by it, as PEM files.

Made with the ``cryptography`` package (no ``openssl`` binary needed), EC P-256 keys (fast to make and to
handshake with), PKCS#8 unencrypted private keys (what Kafka's PEM keystores read: KIP-651). Everything a test
needs to go wrong on purpose is one call: a certificate from another CA, one that expired, one for another host.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA", "Issued"]

_DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key on disk: ``cert`` (PEM chain, leaf first), ``key`` (PKCS#8), ``pem`` (key and
    chain in one file: a Kafka PEM keystore)."""

    cert: Path
    key: Path
    pem: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CA:
    """A certificate authority whose files live in ``directory`` (``<name>-ca.pem``)."""

    def __init__(self, directory: Path, name: str = "sluice-test") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert = self.directory / f"{name}-ca.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"), client: bool = False,
              expired: bool = False, file_stem: str | None = None) -> Issued:
        """A leaf certificate for ``hosts`` (DNS names or IP addresses in the subjectAltName), for a server or
        (``client``) a client; ``expired``: valid only in the past."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        before, after = (now - 10 * _DAY, now - 5 * _DAY) if expired else (now - _DAY, now + 30 * _DAY)
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(before).not_valid_after(after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH] if client else
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = self.directory / (file_stem or f"{self.name}-{name}")
        paths = Issued(stem.with_suffix(".crt"), stem.with_suffix(".key"), stem.with_suffix(".pem"))
        chain = cert.public_bytes(serialization.Encoding.PEM)
        # Written whole in one go each: a reader (a reload) never sees half a file of the new pair.
        paths.cert.write_bytes(chain)
        paths.key.write_bytes(_key_pem(key))
        paths.pem.write_bytes(_key_pem(key) + chain)
        return paths
