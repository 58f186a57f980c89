"""Load SLO specs in one call, for tests that check one file or directory at a time."""

from __future__ import annotations

from pathlib import Path

from slogen.loaders import load_paths
from slogen.model import SLO


def load_path(path: str | Path) -> list[SLO]:
    """The SLOs in a file or directory; raises SpecErrors listing every problem."""
    return load_paths([path]).slos
