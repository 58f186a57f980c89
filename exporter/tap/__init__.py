"""Goodput tap: an in-line streaming proxy that times every completion and counts goodput.

Modules: classes (SLO classes from the SLO YAML), settings (the tap's settings), http1 (HTTP/1.1
framing, no I/O), upstream (keep-alive connections to the engine), proxy (what the connections share),
connection (one client's connection), exchange (one request's cycle, on narrow collaborators), policy
(the per-request decisions: plan, upstream head, the finished record and its goodput verdict, the
gave-up rule, usage plausibility), flow (pausing and resuming reads), outcomes (a request's outcome),
relay (timing a response body and taking out the injected usage), sse (byte-preserving event
splitter), timing (per-request state machine), deadlines
(how long the engine may keep a request waiting), request_fields (the request body's few fields
the tap reads), metrics (the counters and histograms),
exposition (the /metrics page, rendered in slices between relayed chunks), models (which model
names may be label values: the upstream's /v1/models and the class globs), server
(listeners), workers (`--workers N`: several processes, one summed /metrics), cli
(`llmslo-exporter tap`), admission (`--admission`: refuse what the engine would not serve in time) with
page_reader and page_child (the engine's page fetched and parsed in a child process).
"""
