"""Which package may import which (docs/architecture.md): an AST scan of every module, imports inside functions included.

Top level: `llmslo` (the shared contracts) imports none of ours; `exporter`, `slogen` and `simulator` import only
`llmslo`; nothing shipped imports `demo`, `bench`, `tests` or `realengine`. Inside slogen: the rule compiler
(`rules/`) imports neither `promtests/` nor `artifacts/`, `artifacts/` does not import `promtests/`, and no folder
imports the stages that run it (`steps`, `build`, `cli`). Each rule is also shown failing on a synthetic tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("llmslo", "exporter", "slogen", "simulator")
HARNESS = ("realengine", "demo", "bench")
# package -> the packages of ours it may import (tests may import everything)
ALLOWED = {
    "llmslo": set(),
    "exporter": {"llmslo"},
    "slogen": {"llmslo"},
    "simulator": {"llmslo"},
    "realengine": set(PRODUCT),
    # the demo and the benchmarks run on the simulator or a real engine
    "demo": {*PRODUCT, "realengine"},
    "bench": {*PRODUCT, "realengine"},
}
# slogen folder -> slogen modules it may not import (a folder never imports the stages that run it)
RUNNERS = ("slogen.steps", "slogen.build", "slogen.cli")
SLOGEN_FORBIDDEN = {
    "rules": ("slogen.promtests", "slogen.artifacts", *RUNNERS),
    "artifacts": ("slogen.promtests", *RUNNERS),
    "promtests": ("slogen.artifacts", *RUNNERS),
    "loaders": ("slogen.rules", "slogen.promtests", "slogen.artifacts", *RUNNERS),
    "plugins": ("slogen.rules", "slogen.promtests", "slogen.artifacts", *RUNNERS),
}


def imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `path`, relative ones resolved against its package under `root`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = list(path.parent.relative_to(root).parts)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join([*parts, *([node.module] if node.module else [])])
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def violations(root: Path) -> list[str]:
    """Every import under `root` that breaks the rules above, as `file:line: imports module (why)`."""
    found = []
    for pkg in [*ALLOWED, "tests"]:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, module in imports(path, root):
                top = module.split(".")[0]
                if pkg != "tests" and top in ALLOWED and top != pkg and top not in ALLOWED[pkg]:
                    found.append(f"{rel}:{line}: imports {module} ({pkg} may import only {sorted(ALLOWED[pkg])})")
                if pkg != "tests" and top == "tests":
                    found.append(f"{rel}:{line}: imports {module} (nothing imports tests)")
                parts = path.relative_to(root).parts
                if pkg == "slogen" and len(parts) > 2 and parts[1] in SLOGEN_FORBIDDEN:
                    for bad in SLOGEN_FORBIDDEN[parts[1]]:
                        if (module == bad or module.startswith(bad + ".")):
                            found.append(f"{rel}:{line}: imports {module} (slogen/{parts[1]}/ may not import {bad})")
    return found


def test_the_packages_import_in_one_direction():
    problems = violations(ROOT)
    assert problems == [], "imports against docs/architecture.md:\n" + "\n".join(problems)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize("rel,text,why", [
    ("llmslo/names.py", "from slogen.model import SLO\n", "llmslo may import only []"),
    ("exporter/server.py", "def f():\n    import simulator.engine\n", "exporter may import only ['llmslo']"),
    ("slogen/cli.py", "from demo.stack import Stack\n", "slogen may import only ['llmslo']"),
    ("simulator/api.py", "import tests.helpers\n", "nothing imports tests"),
    ("slogen/rules/files.py", "from slogen.promtests.health_tests import health_tests\n",
     "slogen/rules/ may not import slogen.promtests"),
    ("slogen/rules/files.py", "from ..artifacts import keda\n", "slogen/rules/ may not import slogen.artifacts"),
    ("slogen/artifacts/keda.py", "from slogen.steps import STEPS\n", "slogen/artifacts/ may not import slogen.steps"),
    ("slogen/promtests/slo_tests.py", "from slogen.artifacts.runbooks import topic\n",
     "slogen/promtests/ may not import slogen.artifacts"),
    ("slogen/promtests/dashboards.py", "from slogen.artifacts import dashboards as d\n",
     "slogen/promtests/ may not import slogen.artifacts"),
])
def test_a_violation_fails(tmp_path, rel, text, why):
    root = _tree(tmp_path, {"llmslo/__init__.py": "", "slogen/__init__.py": "", "tests/test_x.py": "import demo\n",
                            "demo/__init__.py": "import slogen\n", rel: text})
    problems = violations(root)
    assert len(problems) == 1 and why in problems[0] and problems[0].startswith(rel + ":"), problems


def test_a_clean_synthetic_tree_passes(tmp_path):
    root = _tree(tmp_path, {"llmslo/conventions.py": "", "exporter/server.py": "from llmslo import conventions\n",
                            "slogen/artifacts/keda.py": "from slogen.rules import capacity\nfrom ..views import SLOView\n",
                            "bench/b.py": "import exporter.server\n", "tests/t.py": "import bench.b\nimport demo\n"})
    assert violations(root) == []
