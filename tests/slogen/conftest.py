"""Shared fixtures for slogen tests: paths to the Sloth/OpenSLO/Pyrra peer data (skip only when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.needs import command, shared_dir

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
SLOTH = SHARED / "peers" / "sloth"
SLOTH_TESTDATA = SLOTH / "test" / "integration" / "prometheus" / "testdata"
OPENSLO = SHARED / "peers" / "openslo"
PYRRA = SHARED / "peers" / "pyrra"


@pytest.fixture
def sloth_testdata() -> Path:
    return shared_dir(SLOTH_TESTDATA, "peers/sloth")


@pytest.fixture
def sloth_dir() -> Path:
    return shared_dir(SLOTH, "peers/sloth")


@pytest.fixture
def openslo_dir() -> Path:
    return shared_dir(OPENSLO, "peers/openslo")


@pytest.fixture(scope="session")
def pyrra_dir() -> Path:
    return shared_dir(PYRRA, "peers/pyrra")


@pytest.fixture
def promtool() -> str:
    return command("promtool", "run scripts/install-system-deps.sh (Debian package prometheus)")
