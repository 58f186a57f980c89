"""What a test needs from the machine: a command it runs (missing fails the test) or reference data from
../shared (missing skips it: only developers and CI have ../shared)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def command(name: str, fix: str) -> str:
    """The path of the command `name`; fails the test with `fix` (how to install it) when it is missing."""
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} is missing: {fix}")
    return path


def shared_dir(path: Path, what: str) -> Path:
    """The folder `path` of ../shared; skips the test (or, called at import, the module), naming `what` it holds,
    when it is absent."""
    if not path.is_dir():
        pytest.skip(f"../shared ({what}) is not present on this machine", allow_module_level=True)
    return path
