"""TLS contexts: the client-facing listeners' (``[listen.tls]``, per-listener certificates from
``[[listen.listeners]]``) and the broker-facing one (``[upstream.tls]``), built from PEM files, and rebuilt when
those files change.

No sockets here: :mod:`proxy.io` hands the current context to each connection it accepts or makes. Reload
swaps the contexts whole: a connection takes the context in force when it starts, so new connections get the new
certificate and open ones keep the session they have (a TLS session is bound to its context's certificate at the
handshake). A reload that fails (a half-written file, a key that does not match its certificate) is logged and
counted, and the contexts in use stay.

Defaults follow Kafka's: TLS 1.2 and 1.3 (``ssl.enabled.protocols``), the broker's certificate verified against
the CA bundle with its host name checked (``ssl.endpoint.identification.algorithm=https``, on by default since
Kafka 2.0), client certificates not asked for unless ``client_auth`` says so (``ssl.client.auth``).
"""

from __future__ import annotations

import fnmatch
import os
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .accesslog import get_logger
from .config import ClientTlsSettings, ConfigError, CoreSettings, ListenSettings, ServerTlsSettings

__all__ = ["ListenerPolicy", "TlsContexts", "client_context", "server_context"]

log = get_logger("sluice.tls")

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _password(path: str) -> Callable[[], str] | None:
    if not path:
        return None

    def read() -> str:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()

    return read


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, password_file: str, section: str) -> None:
    try:
        ctx.load_cert_chain(cert, key, _password(password_file))
    except (ssl.SSLError, OSError) as e:
        # The message names the files and OpenSSL's reason, never a key or password.
        raise ConfigError(f"{section}.cert_file", f"cannot use {cert} with {key}: {_reason(e)}") from None


def _load_ca(ctx: ssl.SSLContext, ca: str, key: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(key, f"cannot load CA bundle {ca}: {_reason(e)}") from None


def _reason(e: BaseException) -> str:
    return getattr(e, "reason", None) or getattr(e, "strerror", None) or str(e)


def server_context(tls: ServerTlsSettings, cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """A listener's context: ``cert_file``/``key_file`` (a per-listener certificate) or the section's own."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    ctx.maximum_version = _VERSIONS[tls.max_version]
    _load_chain(ctx, cert_file or tls.cert_file, key_file or tls.key_file, tls.key_password_file, "listen.tls")
    if tls.client_auth != "none":
        _load_ca(ctx, tls.ca_file, "listen.tls.ca_file")
    ctx.verify_mode = _CLIENT_AUTH[tls.client_auth]
    return ctx


def client_context(tls: ClientTlsSettings) -> ssl.SSLContext:
    """The context of Sluice's connections to the brokers."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verify_mode CERT_REQUIRED, check_hostname on
    ctx.minimum_version = _VERSIONS[tls.min_version]
    if tls.ca_file:
        _load_ca(ctx, tls.ca_file, "upstream.tls.ca_file")
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = tls.check_hostname
    if tls.cert_file:
        _load_chain(ctx, tls.cert_file, tls.key_file, tls.key_password_file, "upstream.tls")
    return ctx


@dataclass(frozen=True, slots=True)
class ListenerPolicy:
    """How one listener takes its connections: the PROXY protocol mode and the TLS context (None: plaintext)."""

    proxy_protocol: str
    ssl: ssl.SSLContext | None


def _stamp(paths: Iterable[str]) -> tuple[tuple[str, int, int, int], ...]:
    """What identifies the files' contents cheaply: (path, inode, size, mtime); a missing file counts as changed
    (a rotation in progress: the next check sees the new one)."""
    out = []
    for p in sorted({p for p in paths if p}):
        try:
            st = os.stat(p)
            out.append((p, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((p, -1, -1, -1))
    return tuple(out)


class TlsContexts:
    """The contexts in force, per listener name and upstream; :meth:`check` rebuilds them when a file changed,
    :meth:`reload` (SIGHUP) rebuilds them whatever the files say. ConfigError at construction (start-up) when a
    file cannot be used."""

    def __init__(self, settings: CoreSettings, on_reload: Callable[[str], object] | None = None) -> None:
        self.listen: ListenSettings = settings.listen
        self.upstream_tls: ClientTlsSettings = settings.upstream.tls
        self._on_reload = on_reload
        self._files = self._paths()
        self._stamp = _stamp(self._files)
        self._server: dict[tuple[str, str], ssl.SSLContext] = {}
        self.upstream: ssl.SSLContext | None = None
        self._build()

    def _paths(self) -> list[str]:
        tls, up = self.listen.tls, self.upstream_tls
        paths = []
        if tls.enabled:
            paths += [tls.cert_file, tls.key_file, tls.key_password_file, tls.ca_file]
            for entry in self.listen.listeners:
                paths += [entry.cert_file, entry.key_file]
        if up.enabled:
            paths += [up.ca_file, up.cert_file, up.key_file, up.key_password_file]
        return [p for p in paths if p]

    def _build(self) -> None:
        """Build every context from the files (ConfigError if one cannot be), then swap them in at once."""
        tls = self.listen.tls
        server: dict[tuple[str, str], ssl.SSLContext] = {}
        if tls.enabled:
            server[("", "")] = server_context(tls)
            for entry in self.listen.listeners:
                if entry.cert_file:
                    pair = (entry.cert_file, entry.key_file)
                    if pair not in server:
                        server[pair] = server_context(tls, *pair)
        upstream = client_context(self.upstream_tls) if self.upstream_tls.enabled else None
        self._server, self.upstream = server, upstream

    @property
    def enabled(self) -> bool:
        return bool(self._files)

    def listener(self, name: str) -> ListenerPolicy:
        """The PROXY protocol mode and TLS context in force for listener ``name`` ("bootstrap", "broker-N")."""
        proxy_protocol: str = self.listen.proxy_protocol
        pair = ("", "")
        for entry in self.listen.listeners:
            if fnmatch.fnmatchcase(name, entry.listener):
                if entry.proxy_protocol is not None:
                    proxy_protocol = entry.proxy_protocol
                if entry.cert_file:
                    pair = (entry.cert_file, entry.key_file)
                break
        return ListenerPolicy(proxy_protocol, self._server.get(pair) if self.listen.tls.enabled else None)

    def check(self) -> bool:
        """Rebuild if a file changed since the last build; True if a reload happened."""
        stamp = _stamp(self._files)
        if stamp == self._stamp:
            return False
        return self._reload(stamp, "files_changed")

    def reload(self) -> bool:
        """Rebuild now (SIGHUP)."""
        return self._reload(_stamp(self._files), "sighup")

    def _reload(self, stamp: tuple[tuple[str, int, int, int], ...], trigger: str) -> bool:
        if not self._files:
            return False
        try:
            self._build()
        except ConfigError as e:
            # The stamp is not taken: the next check tries again (a rotation may be half done).
            log.error("tls_reload_failed", trigger=trigger, error=str(e))
            if self._on_reload is not None:
                self._on_reload("failed")
            return False
        self._stamp = stamp
        log.info("tls_reloaded", trigger=trigger, files=len(self._files))
        if self._on_reload is not None:
            self._on_reload("reloaded")
        return True
