"""Fixtures for the generated-artifact tests: schemas from ../shared, sample SLO views, promtool."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from slogen.rules.bucket_alerts import runbook_details
from slogen.views import ALERT_BUCKET_EDGE, ALERT_BURN, ALERT_NO_DATA, AlertView, BurnTier, SLOView
from tests.helpers.needs import command, shared_dir

ROOT = Path(__file__).resolve().parents[2]


def _load_by_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


k8s = _load_by_path("llmslo_tests_k8s_schemas", Path(__file__).with_name("k8s_schemas.py"))

TIERS = (
    BurnTier("page-quick", "page", "1h", "5m", 14.4),
    BurnTier("page-slow", "page", "6h", "30m", 6.0),
    BurnTier("ticket-quick", "ticket", "1d", "2h", 3.0),
    BurnTier("ticket-slow", "ticket", "3d", "6h", 1.0),
)
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d")


def sample_slos() -> list[SLOView]:
    """One SLO of every kind the generators treat differently."""
    common = dict(windows=WINDOWS, tiers=TIERS)
    return [
        SLOView("chat", "ttft", "chat-ttft", 99.0, "30d", "TTFT under 500 ms", "latency", "ttft", 0.5, "tap",
                "interactive", alert_name="ChatTTFTBudgetBurn", **common),
        SLOView("chat", "tpot", "chat-tpot", 99.0, "30d", "", "latency", "tpot", 0.05, "engine",
                alert_name="ChatTPOTBudgetBurn", **common),
        SLOView("chat", "itl", "chat-itl", 99.0, "30d", "", "latency", "itl", 0.1, "engine",
                alert_name="ChatITLBudgetBurn", **common),
        SLOView("chat", "e2e", "chat-e2e", 95.0, "30d", "", "latency", "e2e", 20.0, "tap", "batch",
                alert_name="ChatE2EBudgetBurn", **common),
        SLOView("chat", "goodput-interactive", "chat-goodput-interactive", 95.0, "30d", "", "goodput",
                slo_class="interactive", alert_name="ChatGoodputBudgetBurn", **common),
        SLOView("chat", "availability", "chat-availability", 99.9, "28d", "", "availability", source="engine",
                alert_name="ChatAvailabilityBudgetBurn", windows=WINDOWS[:-1] + ("28d",), tiers=TIERS),
        SLOView("chat", "kv-headroom", "chat-kv-headroom", 99.0, "30d", "", "kv_headroom",
                threshold=0.9, alert_name="ChatKVHeadroomBudgetBurn", **common),
        SLOView("legacy", "http", "legacy-http", 99.9, "30d", "Sloth raw SLI", "raw", traffic_weighted=False,
                alert_name="LegacyHTTP", **common),
    ]


def sample_alerts() -> list[AlertView]:
    slos = sample_slos()
    tpot = 'llm_time_per_output_token_seconds_bucket{engine="vllm"'
    edges = runbook_details("tpot", "0.05", 'llm_time_per_output_token_seconds_count{engine="vllm"}',
                            tpot + ',le=~"0\\\\.050*"}', tpot + "}", ("cluster", "engine"), ("vllm",))
    return ([AlertView(s.alert_name, ALERT_BURN, s, s.tiers) for s in slos]
            + [AlertView("SLOSourceAbsent", ALERT_NO_DATA, slos[0]),
               AlertView("ChatTPOTBudgetBurnThresholdNotABucketEdge", ALERT_BUCKET_EDGE, slos[1], details=edges,
                         summary="chat tpot: 0.05 s is not a tpot bucket edge of the engines in one cluster.",
                         condition="count by (cluster, engine) (...)", for_="10m")])


@pytest.fixture(scope="session")
def shared() -> Path:
    return shared_dir(k8s.SHARED, "schemas")


@pytest.fixture(scope="session")
def crd(shared: Path):
    """The CRD-schema helpers (k8s_schemas.py): `crd.crd_errors(obj)`."""
    return k8s


@pytest.fixture(scope="session")
def grafana_validator(shared: Path) -> jsonschema.Draft7Validator:
    schema = json.loads((shared / "schemas" / "grafana" / "dashboard.jsonschema.json").read_text())
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="session")
def promtool() -> str:
    return command("promtool", "run scripts/install-system-deps.sh (Debian package prometheus)")


@pytest.fixture(name="sample_slos")
def sample_slos_fixture() -> list[SLOView]:
    return sample_slos()


@pytest.fixture(name="sample_alerts")
def sample_alerts_fixture() -> list[AlertView]:
    return sample_alerts()


@pytest.fixture
def check_exprs(promtool: str, tmp_path: Path):
    """Parse expressions with Prometheus' own parser (as recording rules), failing with promtool's message."""
    return lambda exprs: promtool_check_exprs(promtool, exprs, tmp_path)


def promtool_check_exprs(promtool: str, exprs: dict[str, str], tmp_path: Path) -> None:
    rules = {"groups": [{"name": "syntax", "rules": [
        {"record": f"check:{i}", "expr": expr, "labels": {"source": name[:60]}}
        for i, (name, expr) in enumerate(sorted(exprs.items()))]}]}
    path = tmp_path / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
