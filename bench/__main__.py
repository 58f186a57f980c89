"""`python -m bench [NAME ...]`: run the bench/bench_*.py modules' `run()` and write BENCHMARKS.md.

NAME is a module's name without `bench_`, its underscores or hyphens: `python -m bench tap-abuse` runs bench_tap_abuse.

With no NAME every module runs and the file is rewritten; with NAMEs only their sections are replaced and the
sections of the modules not run are kept as they were (the header's machine and date are always renewed).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from bench.report import Row, merge, render
from llmslo.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    if argv:
        # A module bench_a_b answers to `a_b` and to `a-b` (e.g. `python -m bench tap-abuse`).
        names = [n for n in names if n in argv or n.removeprefix("bench_") in argv
                 or n.removeprefix("bench_").replace("_", "-") in argv]
    rows: list[Row] = []
    notes: dict[str, str] = {}
    for name in names:
        mod = importlib.import_module(f"bench.{name}")
        print(f"== {name}", file=sys.stderr, flush=True)
        result = mod.run()
        rows += result
        notes.update(getattr(mod, "NOTES", {}))
        for r in result:
            print(f"  {r.section} | {r.what}: ours {r.ours}, peer {r.peer}, ratio {r.ratio}", file=sys.stderr)
    out = ROOT / "BENCHMARKS.md"
    if argv and out.exists():
        write_atomic(out, merge(out.read_text(), rows, notes))
    else:
        write_atomic(out, render(rows, notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
