"""BENCHMARKS.md rewrites: a full run replaces every measured section and keeps the RECORDED ones (their code is
gone) as they were; a run of some modules replaces only their sections."""

from __future__ import annotations

from pathlib import Path

from bench.report import RECORDED, Row, merge, render, split_sections


def _row(section: str, ours: str) -> Row:
    return Row(section, "what", ours, "1", "1.00x", "python -m bench x")


PREVIOUS = render([_row("Measured", "old"), _row("Dropped since", "old"), _row(RECORDED[0], "kept")])


def test_a_full_run_keeps_the_recorded_sections_and_drops_stale_ones() -> None:
    sections = split_sections(render([_row("Measured", "new")], previous=PREVIOUS))
    assert list(sections) == ["Measured", RECORDED[0]]
    assert "| new |" in sections["Measured"] and "| kept |" in sections[RECORDED[0]]


def test_a_full_run_without_a_previous_file_has_only_its_rows() -> None:
    assert list(split_sections(render([_row("Measured", "new")]))) == ["Measured"]


def test_a_partial_run_replaces_only_its_sections() -> None:
    sections = split_sections(merge(PREVIOUS, [_row("Measured", "new")]))
    assert list(sections) == ["Measured", "Dropped since", RECORDED[0]]
    assert "| new |" in sections["Measured"] and "| old |" in sections["Dropped since"]


def test_the_recorded_sections_are_in_benchmarks_md_and_no_module_writes_them() -> None:
    root = Path(__file__).resolve().parents[2]
    present = split_sections((root / "BENCHMARKS.md").read_text())
    assert all(title in present for title in RECORDED)
    for module in sorted((root / "bench").glob("bench_*.py")):
        text = module.read_text()
        assert not any(f'"{title}"' in text for title in RECORDED), f"{module.name} still writes a recorded section"
