"""The real-engine tier (tests/realengine) runs only when asked: `make test-vllm` sets LLMSLO_REAL_ENGINE=1.

It needs vLLM's CPU build in its own environment (`make vllm-deps`) and minutes of CPU, so it is its own
target, which `.ci/run` calls after `make test`; `make test` stays within its 10-minute budget.
"""

import os

collect_ignore = [] if os.environ.get("LLMSLO_REAL_ENGINE") == "1" else ["realengine"]
