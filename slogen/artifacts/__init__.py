"""Artifacts beside the rules: Grafana dashboards, runbooks, KEDA ScaledObjects and HPAs, the
Alertmanager configuration and the generated half of deploy/. Each reads frozen views
(`slogen/views.py`) of the compiled catalog; `slogen/steps.py` calls them.
"""
