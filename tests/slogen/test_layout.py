"""Generation reads only the catalog: no step (slogen/steps.py) and no module of the generator packages touches the disk.

`slogen.catalog.compile_catalog` loads every input once and `slogen.outputs` writes the result;
a generator that opened a file mid-chain would make a build depend on more than its catalog
(it once read autoscaling/ and the SLO files itself). An AST scan of about 25 files, well under a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SLOGEN = Path(__file__).resolve().parents[2] / "slogen"
GENERATOR_MODULES = sorted([*(SLOGEN / "rules").glob("*.py"), *(SLOGEN / "promtests").glob("*.py"),
                            *(SLOGEN / "artifacts").glob("*.py"), SLOGEN / "promql.py", SLOGEN / "links.py",
                            SLOGEN / "views.py", SLOGEN / "steps.py"])

# Calls that read or write files, list folders, or parse spec files (YAML loaders, slogen's own loaders).
FILE_CALLS = frozenset({
    "open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob", "rglob", "listdir",
    "scandir", "walk", "is_file", "is_dir", "exists", "stat", "load", "safe_load", "load_all", "safe_load_all",
    "full_load", "unsafe_load", "load_documents", "read_documents", "load_paths", "load_text", "discover",
    "compile_catalog", "write_atomic", "write_outputs", "replace_tree",
})
# Modules that load inputs or write outputs: the stages before and after generation.
STAGE_MODULES = frozenset({"slogen.catalog", "slogen.outputs", "slogen.outtree", "slogen.loaders", "llmslo.files",
                           "slogen.autoscaling.load_paths"})

CATALOG_TYPE = frozenset({"slogen.catalog", "slogen.catalog.Catalog"})  # the steps' input type, not its loader


def _called_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _problems(path: Path, root: Path = SLOGEN.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    rel = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in FILE_CALLS:
            found.append(f"{rel}:{node.lineno}: calls {_called_name(node)}()")
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported = {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            if imported <= CATALOG_TYPE:
                continue
            if node.module == "slogen.build" or imported & STAGE_MODULES:
                found.append(f"{rel}:{node.lineno}: imports from {node.module}")
    return found


def test_the_generator_packages_exist():
    assert len(GENERATOR_MODULES) >= 20 and all(p.is_file() for p in GENERATOR_MODULES)


@pytest.mark.parametrize("path", GENERATOR_MODULES, ids=lambda p: p.relative_to(SLOGEN).as_posix())
def test_generators_open_no_file(path):
    problems = _problems(path)
    assert problems == [], ("generators read only the catalog (load inputs in slogen/catalog.py, write in "
                            "slogen/outputs.py): " + "; ".join(problems))


def test_the_scan_finds_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from slogen.loaders import load_paths\nimport yaml\n"
                   "def f(p):\n    return yaml.safe_load(open(p)) or p.read_text()\n")
    problems = _problems(bad, tmp_path)
    assert sorted(p.split(": ", 1)[1] for p in problems) == [
        "calls open()", "calls read_text()", "calls safe_load()", "imports from slogen.loaders"]
