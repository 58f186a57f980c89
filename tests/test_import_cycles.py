"""No two modules of ours import each other, directly or around a loop: an AST scan of every import at any level
(inside functions and under `if TYPE_CHECKING:` too, since a loop closed by type-only imports is still two modules
that cannot be read or tested apart).

An edge goes to the module an import names: `from a.b import c` goes to `a.b.c` when that is a module of ours, else
to `a.b` (a name taken from it). Importing `a.b.c` runs `a/__init__.py` first, but that is not an edge: a package
whose `__init__` imports its submodules is the usual shape, and it loops only when a submodule takes a name from
the package back (`from a import x`, `from . import x` with `x` not a module), which is an edge and fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.fresh_ast import in_fresh_interpreter

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["llmslo", "exporter", "slogen", "simulator", "realengine", "demo", "bench", "tools"]


def module_name(path: Path, root: Path) -> str:
    """`a/b/c.py` -> `a.b.c`, `a/b/__init__.py` -> `a.b`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _named(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    """The dotted names an import statement asks for, relative ones resolved against `package`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    parts = package[:len(package) - node.level + 1] if node.level else []
    base = ".".join([*parts, *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" if base else alias.name for alias in node.names]


def import_graph(root: str | Path, packages: list[str]) -> dict[str, list[str]]:
    """module -> the sorted modules of ours it imports (see the module docstring for what counts)."""
    root = Path(root)
    paths = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, list[str]] = {}
    for name, path in paths.items():
        package = list(path.parent.relative_to(root).parts)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for dotted in _named(node, package):
                    # the longest prefix that is a module of ours: `a.b.c` if a module, else `a.b` (a name in it)
                    while dotted and dotted not in paths:
                        dotted = dotted.rpartition(".")[0]
                    if dotted and dotted != name:
                        targets.add(dotted)
        graph[name] = sorted(targets)
    return graph


def _components(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, []))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.append(top)
                    if top == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def _loop(graph: dict[str, list[str]], members: list[str]) -> list[str]:
    """One shortest loop through the component's first module, `[a, b, ..., a]` (breadth first)."""
    inside = set(members)
    start = members[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in graph[node]:
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
                if nxt in inside and nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no loop through {start} in {members}")  # a component always has one


def cycles(root: str, packages: list[str]) -> list[str]:
    """Every import loop under `root`, one line each: `a -> b -> a (component: a, b)`."""
    graph = import_graph(root, packages)
    return [f"{' -> '.join(_loop(graph, members))} (component: {', '.join(members)})"
            for members in _components(graph)]


def test_no_module_imports_itself_around_a_loop() -> None:
    found = in_fresh_interpreter("tests.test_import_cycles", "cycles", str(ROOT), PACKAGES)
    assert found == [], "import loops (type-checking imports included):\n" + "\n".join(found)


def _tree(tmp_path: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return str(tmp_path)


def test_a_loop_closed_by_a_type_checking_import_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/proxy.py": "from pkg.connection import Connection\n",
        "pkg/connection.py": ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                              "    from .proxy import Proxy\n"),
        "pkg/clean.py": "from pkg import connection\n",
    })
    assert cycles(root, ["pkg"]) == ["pkg.connection -> pkg.proxy -> pkg.connection "
                                     "(component: pkg.connection, pkg.proxy)"]


def test_a_loop_through_a_function_body_and_three_modules_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "a/__init__.py": "", "b/__init__.py": "",
        "a/one.py": "import b.two\n",
        "b/two.py": "from a import three\n",
        "a/three.py": "def late():\n    from .one import x\n    return x\n",
    })
    assert cycles(root, ["a", "b"]) == ["a.one -> b.two -> a.three -> a.one (component: a.one, a.three, b.two)"]


def test_a_package_and_a_submodule_that_takes_a_name_back_loop(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pkg/__init__.py": "from .sub import thing\nLIMIT = 3\n",
        "pkg/sub.py": "from . import LIMIT\nthing = LIMIT\n",
    })
    assert cycles(root, ["pkg"]) == ["pkg -> pkg.sub -> pkg (component: pkg, pkg.sub)"]


def test_a_package_importing_its_submodules_alone_is_no_loop(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pkg/__init__.py": "from pkg import base, vllm\nfrom .vllm import ADAPTER\n",
        "pkg/base.py": "import json\n",
        "pkg/vllm.py": "from pkg.base import X\nfrom . import base\nimport pkg.base\nADAPTER = 1\n",
    })
    assert import_graph(root, ["pkg"]) == {"pkg": ["pkg.base", "pkg.vllm"], "pkg.base": [], "pkg.vllm": ["pkg.base"]}
    assert cycles(root, ["pkg"]) == []
