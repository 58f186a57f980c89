"""The lint and type gate of `make test`: ruff and mypy with the project's configuration (pyproject.toml's
[tool.ruff] and [tool.mypy]) pass on the tree, and the same commands fail on a deliberate violation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "pyproject.toml"
# What ruff reads: the shipped packages, the harnesses and the tests. mypy reads the list in [tool.mypy] files.
LINTED = ["llmslo", "exporter", "slogen", "simulator", "realengine", "demo", "bench", "tools", "tests"]
# A module with no entry in the mypy debt list (pyproject.toml), copied for the violations.
CLEAN_MODULE = ROOT / "llmslo" / "durations.py"


def _ruff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(CONFIG), *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def _mypy(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG), *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def _violating_copy(tmp_path: Path, tail: str) -> Path:
    copy = tmp_path / "violating.py"
    shutil.copyfile(CLEAN_MODULE, copy)
    with copy.open("a") as f:
        f.write(tail)
    return copy


def test_ruff_passes_on_the_tree() -> None:
    r = _ruff(*LINTED)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_passes_on_the_tree() -> None:
    r = _mypy()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout


def test_ruff_fails_on_an_undefined_name_and_an_unused_import(tmp_path: Path) -> None:
    copy = _violating_copy(tmp_path, "\n\nimport os\n\n\ndef _late() -> float:\n    return undefined_seconds * 2\n")
    r = _ruff(copy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "F821" in r.stdout and "undefined_seconds" in r.stdout
    assert "F401" in r.stdout and "`os` imported but unused" in r.stdout


def test_ruff_fails_on_a_loop_variable_caught_by_a_closure(tmp_path: Path) -> None:
    copy = _violating_copy(tmp_path, "\n\ndef _later() -> list:\n    return [lambda: i for i in range(3)]\n")
    r = _ruff(copy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "B023" in r.stdout


def test_mypy_fails_on_a_wrong_return_type_and_a_bad_call(tmp_path: Path) -> None:
    copy = _violating_copy(tmp_path, '\n\ndef _seconds() -> float:\n    return "5m"\n\n\n'
                                     'def _twice() -> str:\n    return format_prometheus_duration("5m")\n')
    r = _mypy(copy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'Incompatible return value type (got "str", expected "float")' in r.stdout
    assert "[return-value]" in r.stdout and "[arg-type]" in r.stdout
