"""Run an AST scan of the tree in a fresh interpreter.

CPython 3.11's `ast.parse` can fail with "SystemError: AST constructor recursion depth mismatch" in a process
where an earlier test ran into the recursion limit (the suite's hostile-input tests do, on purpose), and
pytest-xdist runs many test files in one worker. A scan run in its own interpreter sees none of that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def in_fresh_interpreter(module: str, function: str, *args: Any) -> Any:
    """`module.function(*args)` (JSON in and out) in a new Python process started at the repository root."""
    code = ("import importlib, json, sys; f = getattr(importlib.import_module(sys.argv[1]), sys.argv[2]); "
            "print(json.dumps(f(*json.loads(sys.argv[3]))))")
    done = subprocess.run([sys.executable, "-c", code, module, function, json.dumps(args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
