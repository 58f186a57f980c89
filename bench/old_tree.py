"""Packages (the exporter and llmslo by default) as they were at an earlier commit, for side-by-side benchmarks."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def old_tree(commit: str, prefix: str = "bench-old-", packages: tuple[str, ...] = ("exporter", "llmslo")) -> Iterator[Path]:
    """A temporary directory holding `packages` (default `exporter/` and `llmslo/`) at `commit` (put it first on
    PYTHONPATH)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        archive = subprocess.run(["git", "archive", commit, *packages], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
