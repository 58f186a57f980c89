"""`python -m bench [NAME ...]`: run the bench/bench_*.py modules' `run()` and write BENCHMARKS.md.

NAME is a module's name without `bench_`, its underscores or hyphens: `python -m bench tap-abuse` runs bench_tap_abuse.

With no NAME every module runs and the file is rewritten; with NAMEs only their sections are replaced and the
sections of the modules not run are kept as they were (the header's machine and date are always renewed). Either
way the sections of `bench.report.RECORDED`, whose code is gone, stay as last measured.

`--only WORD` (repeatable) runs only the cases whose description contains a WORD, in the modules that take it
(`run(only=...)`; e.g. `python -m bench tap-admission --only decode --only 0.9x`), for iterating on one case; it
prints the rows and leaves BENCHMARKS.md as it is (a partial section is not a result).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

from bench.report import Row, merge, render
from llmslo.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent


def _split_only(argv: list[str]) -> tuple[list[str], tuple[str, ...]] | None:
    """The module names and the --only words; None when an --only lacks its word."""
    names, only, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--only":
            if i + 1 >= len(argv) or not argv[i + 1] or argv[i + 1].startswith("--"):
                return None
            only.append(argv[i + 1])
            i += 2
        else:
            names.append(argv[i])
            i += 1
    return names, tuple(only)


def main(argv: list[str]) -> int:
    split = _split_only(argv)
    if split is None:
        print("python -m bench: --only needs a word of the cases to run (e.g. --only decode)", file=sys.stderr)
        return 2
    argv, only = split
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    if argv:
        # A module bench_a_b answers to `a_b` and to `a-b` (e.g. `python -m bench tap-abuse`).
        names = [n for n in names if n in argv or n.removeprefix("bench_") in argv
                 or n.removeprefix("bench_").replace("_", "-") in argv]
    rows: list[Row] = []
    notes: dict[str, str] = {}
    for name in names:
        mod = importlib.import_module(f"bench.{name}")
        if only and "only" not in inspect.signature(mod.run).parameters:
            print(f"python -m bench: --only: {name} cannot run only some cases (its run() takes no `only`); "
                  "name only modules that do, e.g. tap-admission", file=sys.stderr)
            return 2
        print(f"== {name}", file=sys.stderr, flush=True)
        result = mod.run(only=only) if only else mod.run()
        rows += result
        notes.update(getattr(mod, "NOTES", {}))
        for r in result:
            print(f"  {r.section} | {r.what}: ours {r.ours}, peer {r.peer}, ratio {r.ratio}", file=sys.stderr)
    if only:
        return 0  # the rows are printed above; a partial section is not written
    out = ROOT / "BENCHMARKS.md"
    previous = out.read_text() if out.exists() else ""
    write_atomic(out, merge(previous, rows, notes) if argv else render(rows, notes, previous))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
