"""The sans-IO core of the proxy: the connection state machine, the policy chain and what they share.

``connection.py`` (one client connection and its upstream connection), ``chain.py`` (runs the policies),
``policy.py`` (the policy protocol), ``exchange.py`` (one request/response pair and its effects),
``memory.py`` (the proxy-wide response memory bound), ``routing.py`` (broker nodes <-> listeners, address
rewriting), ``topic_names.py`` (topic id -> name, with lookups). Nothing here touches a socket or reads a clock
of its own: :mod:`proxy.io` does the I/O and injects the clock.
"""
