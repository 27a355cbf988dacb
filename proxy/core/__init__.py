"""The sans-IO core of the proxy: the connection state machine, the policy chain and what they share.

- ``connection.py``: one client connection and its upstream connection, as a state machine; ``observer.py``:
  the events it reports, and the metrics, logs and access log kept from them;
- ``chain.py``: runs the policies over requests and responses; ``policy.py``: the policy protocol (what a policy
  declares, its hooks, its Services); ``registration.py``: what a policy package registers (its section,
  settings model, metrics, access-log fields, whether it changes at run time); ``exchange.py``: one
  request/response pair and the effects policies ask for;
- ``memory.py``: the proxy-wide bound on response bytes held; ``admission.py``: connections in total and per
  client address; ``rate.py``: Kafka's windowed rate with a bound (SimpleRate);
- ``routing.py``: broker node ids <-> listeners, and the rewriting of responses that carry addresses;
- ``topic_names.py``: topic id -> name, with Sluice's own lookups; ``broker_calls.py``: Sluice's own requests to
  the cluster a policy asks for (any API, to a broker, any broker or a key's coordinator), queued for the I/O
  layer;
- ``proxy_protocol.py``: the PROXY protocol v1/v2 header; ``sasl_principal.py``: the principal's name read from
  relayed SASL; ``sasl_client.py``: Sluice's own SASL login; ``selectors.py``: client selectors (client.id,
  principal, client network).

Nothing here touches a socket or reads a clock of its own: `proxy.io` does the I/O and injects the clock.
"""
