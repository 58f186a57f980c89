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


def _logging_promtool(bin_dir: Path, log: Path) -> None:
    """A promtool that records the files it is given and rejects any whose name has `bad` in it."""
    _fake_promtool(bin_dir, f'for f in "$@"; do echo "$f" >> {log}; done\n'
                            'for f in "$@"; do case "$f" in *bad*) echo "FAILED: $f: bad rule" >&2; exit 1;; esac; done\n')


def _checked(log: Path) -> list[str]:
    lines = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return [ln for ln in lines if ln.endswith(".rules.yaml")]


def test_a_file_promtool_accepted_before_is_not_checked_again(tmp_path, monkeypatch):
    """The cache (slogen/checkcache.py) skips exact bytes this promtool accepted; a rejected file, changed bytes,
    another promtool binary and SLOGEN_CACHE_DIR=off are all checked."""
    log = tmp_path / "log"
    _logging_promtool(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLOGEN_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text("groups: []\n# bad\n")

    def run(files: dict) -> tuple[list[str], list[str]]:
        with RuleFilesCheck() as check:
            check.add(files)
            rejected = [rel for rel, _ in check.rejected()]
        return _checked(log), rejected

    good = {"alerts/a.rules.yaml": "groups: []\n", "alerts/b.rules.yaml": "groups: [] # b\n"}
    first, _ = run(good)
    assert len(first) == 2  # a cold cache: every file checked
    assert run(good) == ([], [])  # the same bytes: nothing checked, nothing rejected
    assert len(run({**good, "alerts/b.rules.yaml": "groups: [] # changed\n"})[0]) == 1  # only the changed file
    for _ in range(2):  # a rejected file is never remembered
        checked, rejected = run({"alerts/bad.rules.yaml": bad})
        assert any("bad.rules.yaml" in c for c in checked) and rejected == ["alerts/bad.rules.yaml"]
    monkeypatch.setenv("SLOGEN_CACHE_DIR", "off")
    assert len(run(good)[0]) == 2
    monkeypatch.setenv("SLOGEN_CACHE_DIR", str(tmp_path / "cache"))
    _logging_promtool(tmp_path / "bin2", log)  # another binary: its own verdicts
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin2'}{os.pathsep}{os.environ['PATH']}")
    assert len(run(good)[0]) == 2


def test_a_build_with_the_cache_writes_the_same_files(tmp_path, monkeypatch):
    """A warm check changes what promtool is asked, never what the build writes."""
    monkeypatch.setenv("SLOGEN_CACHE_DIR", str(tmp_path / "cache"))
    from slogen.cli import main

    outs = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        assert main(["build", "--out", str(out), str(ROOT / "slos")]) == 0
        outs.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert outs[0] == outs[1] and outs[0]
