"""Shared fixtures for slogen tests: paths to the Sloth/OpenSLO peer data (skip only when absent)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
SLOTH = SHARED / "peers" / "sloth"
SLOTH_TESTDATA = SLOTH / "test" / "integration" / "prometheus" / "testdata"
OPENSLO = SHARED / "peers" / "openslo"


@pytest.fixture
def sloth_testdata() -> Path:
    if not SLOTH_TESTDATA.is_dir():
        pytest.skip("../shared/peers/sloth is not present")
    return SLOTH_TESTDATA


@pytest.fixture
def openslo_dir() -> Path:
    if not OPENSLO.is_dir():
        pytest.skip("../shared/peers/openslo is not present")
    return OPENSLO


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is required (scripts/install-system-deps.sh installs Debian's prometheus package)"
    return path
