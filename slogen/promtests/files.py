"""The per-service promtool test files of a build, as a chain entry `(catalog, options) -> {relative path: text}`."""

from __future__ import annotations

from pathlib import Path

from slogen.paths import rules_path, tests_path
from slogen.promtests.slo_tests import service_tests
from slogen.rules.files import sources
from slogen.writers import header
from slogen.yamlio import dump


def rule_tests(catalog, options) -> dict[str, str]:
    """alerts/<service>.test.yaml: promtool unit tests staging an outage, a slow burn and no data.
    SLOs left without tests are noted in `catalog.notes` (the CLI prints them)."""
    out = {}
    for svc, items in catalog.services.items():
        doc, skipped = service_tests(items, Path(rules_path(svc)).name)
        catalog.notes += [f"{s.slo_id}: no generated tests ({s.reason})" for s in skipped]
        if doc is not None:
            out[tests_path(svc)] = header(sources(items), options.gen.version) + "\n" + dump(doc)
    return out
