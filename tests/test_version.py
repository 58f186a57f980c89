"""One version, written once in pyproject.toml and read through `llmslo.version.version()` everywhere it is shown.

Every place that names llmslo's version agrees with pyproject.toml: `llmslo.__version__`, the exporter's
`--version` and `llmslo_build_info`, `slogen --version` and the rules' `sloth_version`. No module of the packages
writes a version of its own (an AST scan for `__version__`/`VERSION` assignments of a literal and for the
literal itself), and without an installed distribution the fallback is the source tree's pyproject.toml.
"""

from __future__ import annotations

import ast
import importlib.util
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import llmslo
import slogen
from exporter import cli, procinfo
from llmslo import version as version_module
from llmslo.version import UNKNOWN, version
from slogen import cli as slogen_cli

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llmslo", "exporter", "slogen", "simulator")
DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_every_place_that_names_the_version_reads_pyprojects(capsys) -> None:
    assert version() == DECLARED == metadata.version("llmslo")
    assert llmslo.__version__ == DECLARED
    assert slogen.__version__ == DECLARED and slogen.VERSION_LABEL == f"slogen-{DECLARED}"
    assert procinfo.build_info()["version"] == DECLARED
    assert cli.version_text() == \
        f"llmslo-exporter {DECLARED} ({platform.python_implementation()} {platform.python_version()})"
    with pytest.raises(SystemExit):
        slogen_cli.main(["--version"])
    assert capsys.readouterr().out == f"slogen {DECLARED}\n"


def _literal_versions(path: Path, root: Path = ROOT) -> list[str]:
    """Assignments of a version-like string literal to a name that says version (file-format versions such as
    "llmslo/thresholds/v1" are not ours), and the declared version as a literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            looks_like_ours = re.match(r"^(v?\d+(\.\d+)+\S*|dev|unknown)$", node.value.value)  # not "llmslo/x/v1"
            if looks_like_ours and any("version" in n.lower() for n in names):
                found.append(f"{path.relative_to(root)}:{node.lineno} {names[0]} = {node.value.value!r}")
        if isinstance(node, ast.Constant) and node.value == DECLARED:
            found.append(f"{path.relative_to(root)}:{node.lineno} the literal {DECLARED!r}")
    return found


def test_no_module_writes_a_version_of_its_own() -> None:
    found = [hit for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py")) for hit in _literal_versions(path)]
    assert found == []


def test_the_scan_has_teeth(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(f'__version__ = "{DECLARED}"\nVERSION = "9.9"\nx = "{DECLARED}"\nSPEC_VERSION = "llmslo/a/v1"\n')
    assert len(_literal_versions(bad, tmp_path)) == 4  # two assignments, and the literal twice; not the spec


def _fresh_copy(where: Path):
    """llmslo/version.py loaded afresh from `where`/llmslo/version.py (its cache empty)."""
    (where / "llmslo").mkdir(parents=True, exist_ok=True)
    shutil.copy(version_module.__file__, where / "llmslo" / "version.py")
    spec = importlib.util.spec_from_file_location("llmslo_version_copy", where / "llmslo" / "version.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_an_install_the_source_trees_pyproject_decides(tmp_path, monkeypatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    monkeypatch.setattr(sys, "path", [])  # no llmslo-*.dist-info to read either
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "llmslo"\nversion = "7.8.9"\n')
    assert _fresh_copy(tmp_path).version() == "7.8.9"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\nversion = "1.0"\n')
    assert _fresh_copy(tmp_path).version() == UNKNOWN
    (tmp_path / "pyproject.toml").unlink()
    assert _fresh_copy(tmp_path).version() == UNKNOWN


def test_the_installed_version_is_read_from_the_first_dist_info_on_the_path(tmp_path, monkeypatch) -> None:
    """The METADATA `Version` of the first matching dist-info, as importlib.metadata would pick it; a
    distribution whose name only starts with llmslo is not ours."""
    for name, declared in (("llmslo_extras-9.9.9.dist-info", "9.9.9"), ("LLMSLO-4.5.6.dist-info", "4.5.6")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "METADATA").write_text(f"Metadata-Version: 2.1\nName: x\nVersion: {declared}\n\nVersion: 0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path), *sys.path])
    assert _fresh_copy(tmp_path / "copy").version() == "4.5.6"


def test_reading_the_version_does_not_import_importlib_metadata() -> None:
    """importlib.metadata loads email, zipfile and csv: a third of `llmslo-exporter --once`'s imports once."""
    code = ("import sys; from llmslo.version import version; v = version(); "
            "print(v, 'importlib.metadata' in sys.modules, 'email' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [DECLARED, "False", "False"]
