"""A real Kafka broker with TLS and SASL listeners next to its PLAINTEXT one, for the security tests and
``bench.passthrough --tls``.

The same :class:`~rig.kafka.KafkaBroker` (one KRaft node), with listeners added through its ``overrides``:

- ``SSL``: TLS, client certificates required (``ssl.client.auth=required``: mTLS);
- ``SASL_PLAINTEXT`` and ``SASL_SSL``: PLAIN (users in the JAAS config, as Kafka's PlainLoginModule reads them),
  SCRAM-SHA-256/512 (users created through the Admin API, alterUserScramCredentials: KRaft keeps SCRAM
  credentials in the metadata log), OAUTHBEARER with Kafka's unsecured JWS validator (KIP-255's default:
  tokens are not signed, the ``sub`` claim is the principal); sessions expire after ``reauth_ms``
  (``connections.max.reauth.ms``), so clients re-authenticate on open connections (KIP-368);
- PLAINTEXT stays for the inter-broker and controller traffic and the rig's own readiness check.

With ``authorizer=True`` the broker is locked down as production runs it: KRaft's ``StandardAuthorizer``
(KIP-801) with ``allow.everyone.if.no.acl.found=false``, so a principal may do only what an ACL allows it (a
resource without ACLs is closed to all); ``User:ANONYMOUS`` (the PLAINTEXT and CONTROLLER listeners: the broker
itself, the rig, the ACLs' own setting) is a super user. :func:`allow` grants ACLs (proxy/kafka_acls.py's, for
Sluice's principals: the README's table).

The TLS listeners present a certificate for ``localhost`` only and advertise ``localhost``: connecting to
``127.0.0.1`` is a host-name mismatch, which the tests use. The PEM files come from :class:`rig.pki.CA`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.kafka_acls import Grant
from rig.kafka import KafkaBroker, free_ports
from rig.pki import CA, Issued

__all__ = ["LOCKED_USERS", "SASL_USERS", "SecureBroker", "allow", "create_scram_user", "revoke", "scram_client"]

#: PLAIN users (the broker's JAAS config) and SCRAM users (created by :func:`create_scram_user`): name -> password
SASL_USERS = {"alice": "alice-pw-Zq81", "bob": "bob-pw-Xk27"}
#: the locked-down broker's SCRAM users: Sluice's principals, one per role of proxy/kafka_acls.py, and a client
#: application's (bob)
LOCKED_USERS = {"sluice": "sluice-pw-Tq40", "sluice-writer": "writer-pw-Hh21", "sluice-reader": "reader-pw-Pz88",
                "bob": SASL_USERS["bob"]}
_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


def scram_client(user: str, java: bool = False) -> dict[str, str]:
    """A client's SASL/SCRAM-SHA-512 login as ``user`` (a :data:`LOCKED_USERS` one) over plaintext, to a Sluice that
    passes it through: librdkafka's properties, or the Java client's (``java``)."""
    if java:
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.jaas.config": f'{_SCRAM} required username="{user}" password="{LOCKED_USERS[user]}";'}
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": LOCKED_USERS[user]}


@dataclass(frozen=True)
class SecureBroker:
    """The broker and where its listeners are; ``client`` is a client certificate the SSL listener accepts."""

    broker: KafkaBroker
    ca: CA
    server: Issued
    client: Issued
    ssl_port: int
    sasl_plaintext_port: int
    sasl_ssl_port: int
    #: connections.max.reauth.ms of its SASL listeners (0: sessions never expire)
    reauth_ms: int = 0

    @property
    def plaintext(self) -> str:
        return self.broker.bootstrap

    @property
    def ssl(self) -> str:
        return f"localhost:{self.ssl_port}"

    @property
    def sasl_plaintext(self) -> str:
        return f"127.0.0.1:{self.sasl_plaintext_port}"

    @property
    def sasl_ssl(self) -> str:
        return f"localhost:{self.sasl_ssl_port}"

    def sluice_login(self, user: str = "sluice") -> dict[str, object]:
        """Sluice's settings (dotted keys) for its own login to the SASL_SSL listener as ``user``, SCRAM over TLS: the
        upstream of a Sluice whose clients' own SASL logins pass through it."""
        return {"upstream.tls.enabled": True, "upstream.tls.ca_file": str(self.ca.cert),
                "upstream.sasl.mechanism": "SCRAM-SHA-512", "upstream.sasl.username": user,
                "upstream.sasl.password": LOCKED_USERS[user]}

    @classmethod
    def start(cls, directory: Path, *, reauth_ms: int = 0, jvm_opts: tuple[str, ...] | None = None,
              authorizer: bool = False) -> SecureBroker:
        ca = CA(directory, "broker")
        server = ca.issue("server", hosts=("localhost",))
        client = ca.issue("sluice-client", client=True, hosts=())
        p, c, ssl_port, sp_port, ss_port = free_ports(5)
        users = " ".join(f'user_{u}="{pw}"' for u, pw in SASL_USERS.items())
        overrides: dict[str, str | int] = {
            "listeners": f"PLAINTEXT://127.0.0.1:{p},CONTROLLER://127.0.0.1:{c},SSL://127.0.0.1:{ssl_port},"
                         f"SASL_PLAINTEXT://127.0.0.1:{sp_port},SASL_SSL://127.0.0.1:{ss_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{p},SSL://localhost:{ssl_port},"
                                    f"SASL_PLAINTEXT://127.0.0.1:{sp_port},SASL_SSL://localhost:{ss_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,"
                                              "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(server.pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(ca.cert),
            "listener.name.ssl.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
        }
        if authorizer:
            overrides.update({"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                              "allow.everyone.if.no.acl.found": "false", "super.users": "User:ANONYMOUS"})
        for name in ("sasl_plaintext", "sasl_ssl"):
            prefix = f"listener.name.{name}"
            overrides[f"{prefix}.plain.sasl.jaas.config"] = f"{_PLAIN} required {users};"
            overrides[f"{prefix}.scram-sha-256.sasl.jaas.config"] = f"{_SCRAM} required;"
            overrides[f"{prefix}.scram-sha-512.sasl.jaas.config"] = f"{_SCRAM} required;"
            overrides[f"{prefix}.oauthbearer.sasl.jaas.config"] = (
                f'{_OAUTH} required unsecuredLoginStringClaim_sub="broker";')
            if reauth_ms:
                overrides[f"{prefix}.connections.max.reauth.ms"] = reauth_ms
        broker = KafkaBroker(port=p, controller_port=c, overrides=overrides,
                             jvm_opts=list(jvm_opts) if jvm_opts else None)
        broker.start()
        return cls(broker, ca, server, client, ssl_port, sp_port, ss_port, reauth_ms)

    def close(self) -> None:
        self.broker.close()


def create_scram_user(bootstrap: str, user: str, password: str, mechanisms: tuple[str, ...] = ("SCRAM-SHA-256",
                                                                                             "SCRAM-SHA-512")) -> None:
    """Create (or update) a SCRAM user through the Admin API (alterUserScramCredentials, KIP-554), over the
    broker's PLAINTEXT listener."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for m in mechanisms:  # one credential per user and request (DUPLICATE_RESOURCE otherwise)
        info = ScramCredentialInfo(getattr(ScramMechanism, m.replace("-", "_")), 4096)
        for future in admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(user, info, password.encode())]).values():
            future.result(timeout=30)


def allow(bootstrap: str, principal: str, grants: Iterable[Grant]) -> None:
    """Create ACLs allowing ``principal`` (``User:name``) each grant, over the broker's PLAINTEXT listener (a
    super user's)."""
    from confluent_kafka.admin import AdminClient

    bindings = _bindings(principal, grants)
    if not bindings:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the futures resolve
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def revoke(bootstrap: str, principal: str, grants: Iterable[Grant]) -> None:
    """Delete the ACLs :func:`allow` created for these grants (an operator revoking access while clients run)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_acls(_bindings(principal, grants, filters=True)).values():
        assert future.result(timeout=30), "no ACL matched"


def _bindings(principal: str, grants: Iterable[Grant], filters: bool = False) -> list[Any]:
    """confluent-kafka's bindings of the grants (``filters``: as delete_acls takes them)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kind = AclBindingFilter if filters else AclBinding
    return [kind(ResourceType[_RESOURCES[g.resource]], g.name, ResourcePatternType[g.pattern.upper()],
                 principal, "*", AclOperation[_snake(g.operation)], AclPermissionType.ALLOW)
            for g in grants]


#: Kafka's resource types as confluent-kafka's enum names them
_RESOURCES = {"Topic": "TOPIC", "Group": "GROUP", "TransactionalId": "TRANSACTIONAL_ID", "Cluster": "BROKER"}


def _snake(operation: str) -> str:
    """Kafka's operation name (``DescribeConfigs``) as confluent-kafka's enum spells it (``DESCRIBE_CONFIGS``)."""
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(operation)).upper()
