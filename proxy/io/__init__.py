"""The I/O layer, the only code that touches sockets: accepting client connections (:mod:`.listeners`), the
transports of each client connection (:mod:`.transports`), Sluice's own requests to the cluster (:mod:`.cluster`,
over :mod:`.own_connection`), and the admin API's HTTP server (:mod:`.http_server`). It adapts the sans-IO core
(:mod:`proxy.core`) to asyncio and names no policy.
"""
