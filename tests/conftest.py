"""The real-engine tier (tests/realengine) runs only when asked: `make test-vllm` sets LLMSLO_REAL_ENGINE=1.

It needs vLLM's CPU build in its own environment (`make vllm-deps`) and minutes of CPU, so it is its own
target, which `.ci/run` calls after `make test`; `make test` stays within its 10-minute budget.
"""

import os
from pathlib import Path

import pytest

collect_ignore = [] if os.environ.get("LLMSLO_REAL_ENGINE") == "1" else ["realengine"]

# The files that take a minute or more of one core, started first: xdist hands whole files out in collection
# order (--dist loadfile), so one of these collected last would run alone at the end, on one core, while the
# other waits. Only the order changes; every test still runs.
LONGEST_FIRST = (
    "tests/slogen/test_promtool.py", "tests/integration/test_e2e.py", "tests/slogen/test_pyrra.py",
    "tests/artifacts/test_onnamespace_routing.py", "tests/integration/test_fleet.py", "tests/packaging/test_installed.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = str(config.rootpath) + os.sep
    items.sort(key=lambda item: rank.get(str(item.path).removeprefix(root), len(rank)))  # stable: the rest keep order


@pytest.fixture(scope="session", autouse=True)
def _slogen_cache(tmp_path_factory: pytest.TempPathFactory):
    """slogen's promtool-check cache (slogen/checkcache.py) in a temporary directory, not the home's ~/.cache:
    the suite leaves nothing behind, and each run starts cold (its subprocesses inherit it too)."""
    before = os.environ.get("SLOGEN_CACHE_DIR")
    os.environ["SLOGEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("slogen-cache"))
    yield
    if before is None:
        os.environ.pop("SLOGEN_CACHE_DIR", None)
    else:
        os.environ["SLOGEN_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def repository_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository's `slogen build` with its promtool tests, written to a temporary directory: the repository
    commits none (llmslo.yaml: promtoolTests: false), the suite runs them. alerts/ holds each rule file beside
    its tests, as promtool reads them; dashboards/ the dashboards and dashboards.test.yaml."""
    from dataclasses import replace

    from slogen.build import build
    from tests.artifacts.test_committed_outputs import repository_options

    root = Path(__file__).resolve().parents[1]
    options = repository_options(inputs=(str(root / "slos"),))
    assert options.install is not None
    options = replace(options, install=replace(options.install, promtool_tests=True))
    out = tmp_path_factory.mktemp("repository-build")
    for rel, text in build(options).files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(str(text), encoding="utf-8")
    return out
