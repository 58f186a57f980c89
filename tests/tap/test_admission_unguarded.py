"""Issue 34: `--admission` without a TTFT objective refuses nothing for the wait (a prefill-bound overload is
admitted whole); the tap says so at start, naming what the gate protects, what it does not, and the fix."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.tap.admission import warn_unguarded
from exporter.tap.classes import SloClass, SloConfig

ROOT = Path(__file__).resolve().parents[2]


def _start_log(*flags: str) -> str:
    """The tap's start-up log: it builds its gate, then cannot listen (the port is held) and exits 2."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "exporter.tap", "--listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:9",
             "--metrics-listen", "127.0.0.1:0", "--admission", *flags],
            capture_output=True, text=True, timeout=30, cwd=ROOT,
        )
    assert proc.returncode == 2, proc.stderr
    return proc.stderr


def test_admission_without_slo_warns_at_start_what_it_does_not_protect() -> None:
    log = _start_log()
    line = next(x for x in log.splitlines() if "event=tap_admission_unguarded" in x)
    assert "WARNING" in line and "missing_objectives=ttft,tpot" in line
    assert "prefill-bound overload" in line and "--slo" in line
    assert "tap_admission_unguarded" not in _start_log("--slo", str(ROOT / "slos" / "chat.yaml"))


def test_a_class_with_a_ttft_but_no_tpot_objective_names_decode_overload(caplog: pytest.LogCaptureFixture) -> None:
    ttft_only = SloConfig((SloClass("interactive", 0.5, None, ("*",)),), {})
    both = SloConfig((SloClass("interactive", 0.5, 0.05, ("*",)),), {})
    with caplog.at_level("WARNING"):
        assert warn_unguarded(ttft_only) and not warn_unguarded(both)
    assert len(caplog.records) == 1 and "missing_objectives=tpot" in caplog.text and "decode overload" in caplog.text
