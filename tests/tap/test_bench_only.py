"""`python -m bench NAME --only WORD`: only the chosen cases, BENCHMARKS.md untouched; a bad --only exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import bench_tap_admission as rt

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_only_selects_cases_by_a_word_of_their_description_and_searches_only_their_capacity() -> None:
    cases, caps = rt.cases(("idle engine",))
    assert [c.target for c in cases] == ["idle"] and caps == {}, "the idle case needs no capacity search"
    assert all(w in c.what for c in rt.cases(("bursts of 4",))[0] for w in ("bursts of 4",))


def test_only_prints_the_rows_and_leaves_benchmarks_md_as_it_is() -> None:
    before = (ROOT / "BENCHMARKS.md").read_bytes()
    done = _bench("tap-admission-virtual", "--only", "idle engine")
    assert done.returncode == 0, done.stderr
    assert "idle engine, 200 req/s" in done.stderr and "2x capacity" not in done.stderr
    assert (ROOT / "BENCHMARKS.md").read_bytes() == before


def test_a_bad_only_exits_2_naming_the_flag() -> None:
    for args in (("tap-admission", "--only"), ("tap-admission", "--only", "--x")):
        done = _bench(*args)
        assert done.returncode == 2 and "--only" in done.stderr
    done = _bench("parser", "--only", "x")
    assert done.returncode == 2 and "--only" in done.stderr and "bench_parser" in done.stderr
