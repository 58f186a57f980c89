"""The integration tests drive the local stack in `demo/`, which is not an installed package: make the
repository root importable however pytest was started (`python -m pytest` adds it already, bare `pytest` does not)."""

import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
