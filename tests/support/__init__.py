"""Test-only helpers and checks: topic set-up (topics.py), the cluster tests' readers and checks
(cluster_checks.py), admin and metrics readers, fault injection, log capture, misbehaving local servers.

The rule: what runs real parts (brokers, clusters, Sluice, clients) or is used by a bench lives in rig/; what
only tests use lives here. No module name is in both places, and nothing under rig/ or bench/ imports this
package.
"""
