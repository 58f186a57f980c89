"""Fixtures of the real-engine tier: a real vLLM (CPU build) serving a tiny random-weight Llama (and llama.cpp's
server, test_llamacpp.py, whose fixture lives in that file).

`vllm` is one engine shared by a test file (module scope); `start_vllm(config)` starts another with its own
settings (a smaller KV cache, say) and stops it at the end of the test; `tap_factory(upstream, *flags)` starts a
tap process in front of one (tap_harness.py) and stops it at the end of the test. Engines run with one OpenMP thread, so
the stack in front of them has the other core. Their logs land in the test's tmp directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from realengine import vllm_server
from realengine.vllm_server import VllmConfig, VllmServer
from tests.realengine.tap_harness import Tap, start_tap


def pytest_collection_modifyitems(config, items):
    """Each collected file needs its engine (a module's REAL_ENGINE, vLLM unless it says otherwise)."""
    from realengine import llamacpp_server

    checks = {"vllm": vllm_server.available, "llamacpp": llamacpp_server.available}
    for engine in sorted({getattr(item.module, "REAL_ENGINE", "vllm") for item in items}):
        why = checks[engine]()
        if why:  # fail loudly: a tier that silently skips would hide that nothing ran
            raise pytest.UsageError(f"real-engine tier: {why}")


@pytest.fixture(scope="session")
def tiny_model():
    return vllm_server.model_dir()


@pytest.fixture(scope="module")
def vllm(tmp_path_factory, tiny_model) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VllmServer(VllmConfig(), log_path=log, model=tiny_model) as server:
        yield server


@pytest.fixture
def start_vllm(tmp_path, tiny_model) -> Iterator[Callable[[VllmConfig], VllmServer]]:
    started: list[VllmServer] = []

    def start(config: VllmConfig) -> VllmServer:
        server = VllmServer(config, log_path=tmp_path / f"vllm-{len(started)}.log", model=tiny_model)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def tap_factory(tmp_path) -> Iterator:
    taps: list[Tap] = []

    def make(upstream: str, *extra: str, **kw) -> Tap:
        d = tmp_path / f"tap{len(taps)}"
        d.mkdir()
        taps.append(start_tap(upstream, d, *extra, **kw))
        return taps[-1]

    yield make
    for t in taps:
        t.stop()
