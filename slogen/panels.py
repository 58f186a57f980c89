"""What the dashboards draw and their generated tests check, named once for both
(`slogen/artifacts/dashboards.py` and `slogen/promtests/dashboards.py`): the labels engine and pool
panels aggregate by, the latency quantiles with their query refs, and the late-requests panel's title.
"""

from __future__ import annotations

from llmslo import conventions as c

ENGINE_BY = (c.LABEL_CLUSTER, c.LABEL_NAMESPACE, c.LABEL_POD, c.LABEL_NODE, c.LABEL_ENGINE, c.LABEL_MODEL)
POOL_BY = (c.LABEL_CLUSTER, c.LABEL_NAMESPACE, c.LABEL_MODEL)
QUANTILES = ((0.5, "A"), (0.9, "B"), (0.99, "C"))
LATE_TITLE = "Late requests, not in the percentiles (upstream_timeout, client_gave_up)"
