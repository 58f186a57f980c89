"""The goodput tap injected by a mutating admission webhook: `llmslo-exporter tap-injector`.

A pod that opts in (the label `llmslo.io/tap: enabled`, or a namespace labelled
`llmslo.io/tap-injection: enabled`) gets the tap as a sidecar, the SLO ConfigMap mounted read-only, and its
serving port routed through the tap; every other pod is returned unchanged. `pod.py` decides (a pure function
from a pod to JSON Patch operations or a skip reason), `review.py` turns an AdmissionReview into its answer,
`counters.py` counts what happened, `server.py` serves it over TLS, `cli.py` is the command. docs/deploy.md
("The tap injected") says what is injected and why the port is taken by name.
"""
