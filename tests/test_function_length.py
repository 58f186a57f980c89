"""No function in the packages or the harnesses runs over MAX_LINES lines: a long one is split by what its
parts do. Generated data is exempt only by name, in GENERATED (empty today)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.fresh_ast import in_fresh_interpreter

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["llmslo", "exporter", "slogen", "simulator", "realengine", "demo", "bench", "tools"]
MAX_LINES = 80
# "path.py:function" of generated code allowed to be longer (protoc's output defines no functions).
GENERATED: frozenset[str] = frozenset()


def long_functions(root: str | Path, packages: list[str], limit: int) -> list[str]:
    """'path:name (N lines)' for every function or method, nested ones included, over `limit` lines from its
    `def` to its last line."""
    root = Path(root)
    found = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit and f"{rel}:{node.name}" not in GENERATED:
                        found.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_80_lines() -> None:
    assert in_fresh_interpreter("tests.test_function_length", "long_functions", str(ROOT), PACKAGES, MAX_LINES) == []


def test_the_scan_finds_a_long_function_and_a_long_method(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "pkg").mkdir()
    method_body = body.replace("    ", "        ")
    (tmp_path / "pkg" / "long.py").write_text(  # `long` at line 5, `method` 4 lines after its body
        f"def short():\n    return 1\n\n\ndef long():\n{body}\n\nclass C:\n    async def method(self):\n{method_body}"
    )
    assert in_fresh_interpreter("tests.test_function_length", "long_functions", str(tmp_path), ["pkg"], MAX_LINES) == [
        f"pkg/long.py:5 long ({MAX_LINES + 1} lines)",
        f"pkg/long.py:{5 + MAX_LINES + 4} method ({MAX_LINES + 1} lines)",
    ]
