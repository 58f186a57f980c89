"""Alert windows and periods written with several units (90m -> "1h30m", 36h) flow through every generator."""

from __future__ import annotations

from pathlib import Path

from slogen.cli import main
from slogen.views import window_seconds

REPO = Path(__file__).resolve().parents[2]

CATALOG = """\
apiVersion: sloth.slok.dev/v1
kind: AlertWindows
spec:
  sloPeriod: 36h
  page:
    quick: {errorBudgetPercent: 2, shortWindow: 5m, longWindow: 90m}
    slow: {errorBudgetPercent: 5, shortWindow: 30m, longWindow: 6h}
  ticket:
    quick: {errorBudgetPercent: 10, shortWindow: 2h, longWindow: 1d}
    slow: {errorBudgetPercent: 10, shortWindow: 6h, longWindow: 36h}
"""


def test_window_seconds_reads_every_prometheus_spelling() -> None:
    assert [window_seconds(w) for w in ("5m", "1h30m", "36h", "1d", "2w")] == [300, 5400, 129600, 86400, 1209600]


def test_build_with_a_mixed_unit_catalog_writes_dashboards_and_runbooks(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "windows.yaml").write_text(CATALOG)
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    rc = main(["build", str(REPO / "slos" / "chat.yaml"), "--out", str(out),
               "--windows", str(tmp_path / "windows.yaml"), "--override-period", "36h"])
    assert rc == 0
    assert list(out.rglob("dashboards/*.json")) and list(out.rglob("docs/runbooks/*.md"))
    rules = next(out.rglob("alerts/chat.rules.yaml")).read_text()
    assert "long_window: 1h30m" in rules
