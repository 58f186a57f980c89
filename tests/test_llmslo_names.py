"""Names said once: no public name is defined in two llmslo modules (so `VLLM` cannot mean vLLM's metric
families in one and an engine kind in another), and every `llm_` metric name the code writes as a literal is one
of llmslo.conventions' metrics (so `by_name()` knows everything the code emits)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from llmslo import conventions as c
from tests.helpers.fresh_ast import in_fresh_interpreter

ROOT = Path(__file__).resolve().parent.parent
EMITTING = ["exporter", "slogen", "simulator", "llmslo", "tools"]
MODULE = "tests.test_llmslo_names"  # the scans run in a fresh interpreter (tests/helpers/fresh_ast.py)


def top_level_names(tree: ast.Module) -> list[str]:
    """Public names a module defines itself (assignments, functions, classes), not the ones it imports."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


def clashes(modules: dict[str, str]) -> dict[str, list[str]]:
    """name -> the modules defining it, for every name defined in more than one of `modules` (name -> source)."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in sorted(modules.items()):
        for name in set(top_level_names(ast.parse(source))):
            where[name].append(module)
    return {name: found for name, found in where.items() if len(found) > 1}


def llmslo_clashes() -> dict[str, list[str]]:
    return clashes({p.name: p.read_text() for p in (ROOT / "llmslo").glob("*.py")})


def test_no_public_name_is_defined_in_two_llmslo_modules() -> None:
    assert in_fresh_interpreter(MODULE, "llmslo_clashes") == {}


def test_a_clash_is_found() -> None:
    found = in_fresh_interpreter(MODULE, "clashes", {"conventions.py": "class VLLM:\n    PREFIX = 'vllm:'\n",
                     "bucket_edges.py": "from llmslo import conventions as C\nVLLM = C.ENGINE_VLLM\n_private = 1\n",
                     "other.py": "from llmslo.conventions import VLLM\n_private = 2\n"})
    assert found == {"VLLM": ["bucket_edges.py", "conventions.py"]}


def undefined_metric_literals(root: str | Path, paths: list[str]) -> list[str]:
    """'path:line name' for each `llm_...` name in a string literal that is not a conventions metric (or one of
    its sample names); a name ending in `_` is a prefix and is skipped."""
    known = set(c.by_name())
    samples = known | {n + s for n in known for s in ("_bucket", "_sum", "_count")} | {
        n.removesuffix("_total") for n in known}
    found = []
    for path in map(Path, paths):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in re.findall(r"\bllm_[a-z0-9_]*[a-z0-9]\b", node.value):
                    # llm-d's own names (llm_d_epp_*, a gateway SLI source: llmslo/gateways.py) share our prefix
                    if name not in samples and not name.startswith("llm_d_"):
                        found.append(f"{path.relative_to(Path(root)).as_posix()}:{node.lineno} {name}")
    return found


def test_every_metric_name_written_in_the_code_is_in_all_metrics() -> None:
    paths = [str(p) for pkg in EMITTING for p in sorted((ROOT / pkg).rglob("*.py")) if p.name != "conventions.py"]
    assert in_fresh_interpreter(MODULE, "undefined_metric_literals", str(ROOT), paths) == []


def test_an_undefined_metric_literal_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('A = "llm_tap_requests_total"\nB = "sum(rate(llm_time_to_first_token_seconds_bucket[5m]))"\n'
                      'C = "llm_tap_made_up_total"\nD = "llm_gpu_"\n')
    assert in_fresh_interpreter(MODULE, "undefined_metric_literals", str(tmp_path), [str(module)]) == [
        "m.py:3 llm_tap_made_up_total"]
