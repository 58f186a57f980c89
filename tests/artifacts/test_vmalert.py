"""Every generated rule file loads in vmalert, the fleet's ruler (docs/scaling.md).

`vmalert -dryRun` parses each group, each expression with MetricsQL's parser and each annotation template
with vmalert's functions, exactly as at start-up, and exits non-zero on the first error. It runs on the
committed alerts/*.rules.yaml (what `slogen build` ships), one file at a time and all together as
demo/fleet.py loads them; the promtool test files (*.test.yaml) are not rule files. A broken file is
checked too, so a vmalert that validated nothing could not pass. About 0.1 s in all.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from llmslo.files import write_atomic

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "alerts").glob("*.rules.yaml"))


def _vmalert() -> str:
    path = shutil.which("vmalert") or ("/usr/bin/vmalert" if Path("/usr/bin/vmalert").exists() else None)
    if path is None:
        pytest.fail("vmalert is missing: run `make system-deps` (scripts/install-system-deps.sh installs Debian's "
                    "victoria-metrics, which ships it)")
    return path


def _dry_run(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_vmalert(), "-dryRun", "-loggerLevel=ERROR", *(f"-rule={f}" for f in files)],
                          capture_output=True, text=True, timeout=30)


def test_the_generated_rule_files_are_there():
    assert {p.name for p in RULE_FILES} >= {"chat.rules.yaml", "llmslo-health.rules.yaml",
                                            "llmslo-capacity.rules.yaml"}, RULE_FILES
    assert not [p for p in RULE_FILES if p.name.endswith(".test.yaml")]


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_vmalert_accepts_each_generated_rule_file(path):
    proc = _dry_run(path)
    assert proc.returncode == 0, f"vmalert -dryRun -rule={path.relative_to(ROOT)}:\n{proc.stdout}{proc.stderr}"


def test_vmalert_accepts_them_all_at_once():
    """As the fleet's vmalert loads them: group names must not clash across files."""
    proc = _dry_run(*RULE_FILES)
    assert proc.returncode == 0, f"vmalert -dryRun on {len(RULE_FILES)} files:\n{proc.stdout}{proc.stderr}"


def test_vmalert_dry_run_rejects_a_broken_expression_and_template(tmp_path):
    bad_expr = tmp_path / "expr.rules.yaml"
    write_atomic(bad_expr, "groups:\n- name: g\n  rules:\n  - record: a:b\n    expr: sum(rate(x[5m]) by (le\n")
    bad_template = tmp_path / "template.rules.yaml"
    write_atomic(bad_template, "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n"
                               "    annotations:\n      summary: '{{ $labels.x | nosuchfunc }}'\n")
    for path, needle in ((bad_expr, "a:b"), (bad_template, "nosuchfunc")):
        proc = _dry_run(path)
        assert proc.returncode != 0 and needle in proc.stdout + proc.stderr, proc.stdout + proc.stderr
