"""The real-engine tier (tests/realengine) runs only when asked: `make test-vllm` sets LLMSLO_REAL_ENGINE=1.

It needs vLLM's CPU build in its own environment (`make vllm-deps`) and minutes of CPU, so it is its own
target, which `.ci/run` calls after `make test`; `make test` stays within its 10-minute budget.
"""

import os

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
