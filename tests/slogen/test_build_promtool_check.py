"""`slogen build` checks the rule files with promtool while it makes the rest (slogen/promtoolcheck.py:
RuleFilesCheck, fed by slogen.build's `on_step`): each step's rule files reach the check as soon as the step is
done, a failed check names each rejected file, and a build that stops leaves no promtool running."""

from __future__ import annotations

import os
import time
from pathlib import Path

from slogen.build import BuildOptions, build_into
from slogen.promtoolcheck import RuleFilesCheck

ROOT = Path(__file__).resolve().parents[2]


def _fake_promtool(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "promtool"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)


def test_each_steps_rule_files_reach_the_check_when_the_step_is_done(tmp_path):
    seen: list[list[str]] = []
    built = build_into(BuildOptions(inputs=(str(ROOT / "slos"),)), tmp_path, on_step=lambda files: seen.append(sorted(files)))
    assert sorted(p for step in seen for p in step) == sorted(built.files)  # every file, once
    assert seen[0] and all(p.endswith(".rules.yaml") for p in seen[0])  # the first step: the SLOs' rule files
    later = [p for step in seen[1:] for p in step]
    assert any(p.startswith("dashboards/") for p in later) and all(isinstance(built.files[p], Path) for p in later)


def test_the_check_runs_in_the_background_and_names_each_rejected_file(tmp_path, monkeypatch):
    """A promtool that takes its time: `add` returns at once; one file it rejects is named with its message."""
    _fake_promtool(tmp_path / "bin", 'sleep 0.5\nfor f in "$@"; do case "$f" in *bad*) echo "FAILED: $f: bad rule" >&2; '
                                     'exit 1;; esac; done\nexit 0\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text("groups: []\n")
    with RuleFilesCheck() as check:
        t0 = time.monotonic()
        check.add({"alerts/good.rules.yaml": "groups: []\n", "dashboards/x.json": "{}"})
        check.add({"alerts/bad.rules.yaml": bad})
        assert time.monotonic() - t0 < 0.4  # started, not waited for
        rejected = check.rejected()
    assert [rel for rel, _ in rejected] == ["alerts/bad.rules.yaml"]
    assert "bad rule" in rejected[0][1] and str(bad) not in rejected[0][1]  # promtool's words, the output's path


def test_leaving_the_check_stops_a_promtool_still_running(tmp_path, monkeypatch):
    """A build that fails after its rule files (an error in a later step) does not leave promtool behind."""
    _fake_promtool(tmp_path / "bin", f"echo $$ > {tmp_path / 'pid'}\nexec sleep 60\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    with RuleFilesCheck() as check:
        check.add({"alerts/a.rules.yaml": "groups: []\n"})
        for _ in range(100):
            if (tmp_path / "pid").exists():
                break
            time.sleep(0.02)
        proc = check.running[0]
    assert proc.poll() is not None and time.monotonic() - t0 < 10
