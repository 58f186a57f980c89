"""No module in the packages, the harnesses or the tests runs over MAX_LINES lines: a longer one holds more than one
job, and is split by what its parts do."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["llmslo", "exporter", "slogen", "simulator", "realengine", "demo", "bench", "tools", "tests"]
MAX_LINES = 700


def long_modules(root: Path, folders: list[str], limit: int) -> list[str]:
    """'path (N lines)' for every .py file under the folders with more than `limit` lines."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            with path.open("rb") as f:
                lines = sum(1 for _ in f)
            if lines > limit:
                found.append(f"{rel} ({lines} lines)")
    return found


def test_no_module_is_over_700_lines() -> None:
    found = long_modules(ROOT, FOLDERS, MAX_LINES)
    assert found == [], f"modules over {MAX_LINES} lines (split each by what its parts do):\n" + "\n".join(found)


def test_the_scan_finds_a_long_module_and_passes_one_at_the_limit(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "pkg" / "at_limit.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "pkg" / "notes.txt").write_text("x\n" * (MAX_LINES * 2))
    assert long_modules(tmp_path, ["pkg"], MAX_LINES) == [f"pkg/sub/long.py ({MAX_LINES + 1} lines)"]
