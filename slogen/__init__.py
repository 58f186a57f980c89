"""slogen: SLO specs in, Prometheus rules, alerts, dashboards, KEDA objects and runbooks out."""
