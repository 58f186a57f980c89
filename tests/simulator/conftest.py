"""Fixtures for the simulator tests: small engine configs and real servers on OS-chosen loopback ports."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import pytest

from simulator.api import SimulatorServer, start
from simulator.config import EngineConfig
from simulator.costmodel import CostParams
from simulator.faults import FaultState
from tests.helpers import needs

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"


@pytest.fixture
def shared_dir() -> Path:
    return needs.shared_dir(SHARED, "reference data for the simulator's metric names")


@pytest.fixture
def make_config():
    """EngineConfig factory: the default preset (Llama-3-8B on H100) with a shorter context unless overridden."""

    def make(**overrides) -> EngineConfig:
        base = dict(max_model_len=4096)
        base.update(overrides)
        return EngineConfig(**base)

    return make


class ThreadedServer:
    """A SimulatorServer on its own event loop in a thread, so tests can use blocking clients (openai)."""

    def __init__(self, config: EngineConfig, cost_params: CostParams | None, faults: FaultState | None) -> None:
        self.server = SimulatorServer(config, cost_params, faults)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner = None
        self.url = ""

    def __enter__(self) -> "ThreadedServer":
        self._thread.start()
        self._runner, self.url = self.call(start(self.server))
        return self

    def call(self, coro, timeout: float = 30.0):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __exit__(self, *exc) -> None:
        try:
            if self._runner is not None:
                self.call(self._runner.cleanup())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


@pytest.fixture
def sim_server(make_config):
    """Start servers with `sim_server(**config_overrides, faults=..., cost_params=...)`; all stop at teardown."""
    started: list[ThreadedServer] = []

    def launch(*, faults: FaultState | None = None, cost_params: CostParams | None = None, **overrides):
        srv = ThreadedServer(make_config(**overrides), cost_params, faults).__enter__()
        started.append(srv)
        return srv

    yield launch
    for srv in started:
        srv.__exit__(None, None, None)


# Faster frontend for API tests: the 30 ms tokenize-and-hand-off latency is not what they test.
QUICK = dataclasses.replace(CostParams(), frontend_latency_s=0.0)


@pytest.fixture
def quick_cost() -> CostParams:
    return QUICK
