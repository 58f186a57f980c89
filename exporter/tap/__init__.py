"""Goodput tap: an in-line streaming proxy that times every completion and counts goodput.

Modules: classes (SLO classes from the SLO YAML), sse (byte-preserving event splitter),
timing (per-request state machine), metrics (Prometheus families), proxy (the relay),
server (listeners), cli (`llmslo-exporter tap`).
"""
