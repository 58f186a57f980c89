"""Every metric the code emits is defined in llmslo.conventions and listed in ALL_METRICS, so `by_name()` knows it."""

from __future__ import annotations

from exporter import promtext
from exporter.tap.admission import Admission
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.exposition import PageRenderer
from exporter.tap.gate_reading import Reading
from exporter.tap.metrics import TapMetrics
from exporter.tap.timing import Timings
from llmslo import conventions as C

CLASSES = SloConfig((SloClass("interactive", 0.5, 0.05, ("*",)),), {"ttft": (0.5,), "tpot": (0.05,), "e2e": ()})


def test_every_metric_defined_in_conventions_is_in_all_metrics() -> None:
    defined = {v for v in vars(C).values() if isinstance(v, C.MetricDef)}
    assert defined == set(C.ALL_METRICS)
    assert len(C.ALL_METRICS) == len(set(C.ALL_METRICS)) == len(C.by_name())


def test_every_family_on_the_tap_page_is_known_by_name() -> None:
    metrics = TapMetrics(CLASSES)
    metrics.record("m", "interactive", C.OUTCOME_OK, Timings(0.01, 0.1, 0.02, 0.5, 3, C.USAGE_SOURCE_ENGINE), True)
    metrics.refused(C.REFUSED_MALFORMED)
    gate = Admission("http://127.0.0.1:9")
    gate.update(Reading(8000.0, 1.0, (), ()))
    renderer = PageRenderer(metrics)
    renderer.extra = gate.render
    page = renderer.render_now().decode()
    families = promtext.parse_page(page).families
    known = C.by_name()
    names = {name if name in known else name + "_total" for name in families}
    assert names <= set(known), names - set(known)
    assert {d.name for d in C.TAP_ADMISSION_METRICS} <= names



def test_engine_kinds_are_the_adapters() -> None:
    from exporter.adapters import ADAPTERS
    from exporter.config import ENGINE_KINDS
    from llmslo import bucket_edges

    assert tuple(ADAPTERS) == ENGINE_KINDS == C.ENGINE_KINDS
    assert C.SERVING_ENGINE_KINDS == tuple(k for k in ADAPTERS if k != C.ENGINE_TAP)
    assert {row.kind for row in bucket_edges.ROWS} == set(C.SERVING_ENGINE_KINDS)
