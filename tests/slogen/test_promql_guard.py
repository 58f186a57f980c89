"""slogen.promql refuses a histogram sum that can mix bucket ladders (issue #18), and no generated output has one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmslo import conventions as c
from slogen import promql as q

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("build", [lambda h, by: q.histogram_quantile(0.9, h, [], "5m", by),
                                   lambda h, by: q.bucket_rates(h, [], "5m", by)], ids=["quantile", "heatmap"])
def test_engine_histograms_must_keep_engine_or_pod(build):
    with pytest.raises(q.MixedLaddersError) as err:
        build(c.TTFT, (c.LABEL_CLUSTER,))
    message = str(err.value)
    assert c.TTFT.bucket() in message and "keep engine or pod" in message and c.TAP_TTFT.name in message
    assert "sum by (engine, le)" in build(c.TTFT, (c.LABEL_ENGINE,))
    assert "by (cluster, namespace, pod, le)" in build(c.TPOT, (c.LABEL_CLUSTER, c.LABEL_NAMESPACE, c.LABEL_POD))
    assert "sum by (le)" in build(c.TAP_TTFT, ())  # the tap's ladder is one fleet-wide


def test_no_generated_output_sums_engine_buckets_across_ladders():
    """Every histogram_quantile in the dashboards and runbooks keeps engine or pod, or reads the tap."""
    found = 0
    for path in [*(REPO / "dashboards").glob("*.json"), *(REPO / "docs" / "runbooks").glob("*.md")]:
        for m in re.finditer(r"histogram_quantile\([^,]+,\s*sum by \(([^)]*)\) \(rate\(([a-z_:]+)_bucket", path.read_text()):
            found += 1
            grouping = {g.strip() for g in m.group(1).split(",")}
            assert grouping & set(q.LADDER_LABELS) or m.group(2).startswith(c.PREFIX + "tap_"), f"{path.name}: {m.group(0)}"
    assert found > 20
