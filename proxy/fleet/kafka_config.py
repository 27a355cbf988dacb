"""librdkafka properties of the fleet's clients: where the control cluster is and how Sluice logs in there
(``[fleet] credentials``: the upstream's ``[upstream.tls]``/``[upstream.sasl]`` by default, or ``[fleet.tls]``/
``[fleet.sasl]``). librdkafka's names are its CONFIGURATION.md's; Kafka's equivalents in comments."""

from __future__ import annotations

from typing import Any

from ..config import ClientTlsSettings, FleetSettings, UpstreamSaslSettings, UpstreamSettings

__all__ = ["client_config"]


def client_config(fleet: FleetSettings, upstream: UpstreamSettings, client_id: str) -> dict[str, Any]:
    tls, sasl = (upstream.tls, upstream.sasl) if fleet.credentials == "upstream" else (fleet.tls, fleet.sasl)
    conf: dict[str, Any] = {
        "bootstrap.servers": ",".join(fleet.bootstrap_servers or upstream.bootstrap_servers),
        "client.id": client_id,
        # librdkafka's own log lines would repeat what Sluice logs (once per transition) on every reconnect
        "log.connection.close": False,
        "log_level": 0,
    }
    conf.update(_security(tls, sasl))
    return conf


def _security(tls: ClientTlsSettings, sasl: UpstreamSaslSettings) -> dict[str, Any]:
    # Kafka's security.protocol: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
    protocol = ("SASL_" if sasl.mechanism else "") + ("SSL" if tls.enabled else "PLAINTEXT")
    conf: dict[str, Any] = {"security.protocol": protocol}
    if tls.enabled:
        if tls.ca_file:
            conf["ssl.ca.location"] = tls.ca_file
        # Kafka's ssl.endpoint.identification.algorithm: "https" verifies the broker's name
        conf["ssl.endpoint.identification.algorithm"] = "https" if tls.check_hostname else "none"
        if tls.cert_file:
            conf["ssl.certificate.location"] = tls.cert_file
            conf["ssl.key.location"] = tls.key_file
        if tls.key_password_file:
            with open(tls.key_password_file, encoding="utf-8") as fh:
                conf["ssl.key.password"] = fh.read().strip()
    if sasl.mechanism:
        conf["sasl.mechanism"] = sasl.mechanism
        conf["sasl.username"] = sasl.username
        conf["sasl.password"] = sasl.secret()
    return conf
