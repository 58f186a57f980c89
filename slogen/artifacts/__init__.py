"""Artifacts beside the rules: Grafana dashboards, runbooks, KEDA ScaledObjects and HPAs, the
Alertmanager configuration and the generated half of deploy/. Each reads frozen views
(`views.py`) of the compiled catalog; `files.py` is the build chain's entry.
"""
