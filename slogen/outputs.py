"""The build's last stage: write the generated files, or say why the ones on disk are stale (`--check`).

`write_outputs` replaces the output directories whole (built beside, then swapped: `slogen.outtree`)
and drops files this build generated before but no longer produces.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from slogen.outtree import Content, recover, replace_tree, roots_of, same_content
from slogen.paths import ALERTS_DIR, INSTALL_DIR, PROMETHEUS_RULE_DIR, RETIRED_DIRS
from slogen.writers import GENERATED_MARKER


def _managed_dirs(artifacts: Mapping[str, Content], out: Path) -> set[str]:
    """The folders whose generated files this build owns: its own, those earlier builds wrote (their files
    are orphans now), and every folder of the install's tree (a part of the install turned off, such as the floor
    or the tap injector, leaves a folder this build writes nothing into)."""
    install = out / INSTALL_DIR
    parts = {d.relative_to(out).as_posix() for d in install.rglob("*") if d.is_dir()} if install.is_dir() else set()
    return {str(Path(p).parent) for p in artifacts} | {ALERTS_DIR, PROMETHEUS_RULE_DIR, *RETIRED_DIRS} | parts


def _orphans(artifacts: Mapping[str, Content], out: Path) -> list[str]:
    """Files slogen generated earlier (they carry its marker) that this build no longer produces."""
    found = []
    for d in sorted(_managed_dirs(artifacts, out)):
        base = out / d
        if not base.is_dir():
            continue
        for p in sorted(base.iterdir()):
            rel = p.relative_to(out).as_posix()
            if p.is_file() and rel not in artifacts and p.suffix in (".yaml", ".yml"):
                try:
                    head = p.read_text(encoding="utf-8", errors="replace")[:300]
                except OSError:
                    continue
                if GENERATED_MARKER in head:
                    found.append(rel)
    return found


def write_outputs(artifacts: Mapping[str, Content], out: str | Path) -> tuple[list[str], list[str]]:
    """Replace the output tree under `out` as a whole (`slogen.outtree`: every changed output directory
    is built beside the old one, then swapped in); returns (changed paths, removed orphan paths).
    On any error the outputs are as they were before."""
    root = Path(out)
    dirs = _managed_dirs(artifacts, root)
    recover(root, roots_of(dirs))  # a build that died mid-swap
    removed = _orphans(artifacts, root)
    changed = replace_tree(artifacts, root, dirs, removed)
    return changed, removed


def stale_outputs(artifacts: Mapping[str, Content], out: str | Path) -> list[str]:
    """Why the files under `out` differ from a fresh build (missing, different, orphaned); empty if current."""
    root = Path(out)
    problems = []
    for rel, content in artifacts.items():
        p = root / rel
        if not p.exists():
            problems.append(f"{rel}: missing")
        elif not same_content(p, content):
            problems.append(f"{rel}: out of date")
    problems += [f"{rel}: no longer generated" for rel in _orphans(artifacts, root)]
    return problems
