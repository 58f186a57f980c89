"""realengine's EngineProcess.start: a start that fails or is interrupted (Ctrl-C, a test's own timeout) leaves
no engine running behind it. A stand-in engine (a Python process that never answers /health) is enough."""

from __future__ import annotations

import os
import sys
import urllib.request

import pytest

from realengine.process import EngineProcess


class Silent(EngineProcess):
    """An 'engine' that starts and never becomes healthy; it records its pid where the test can read it."""

    name = "silent"

    def __init__(self, pidfile: str) -> None:
        super().__init__()
        self.pidfile = pidfile
        self.poll_s = 0.05

    def available(self) -> str | None:
        return None

    def argv(self) -> list[str]:
        code = f"import os, time; open({self.pidfile!r}, 'w').write(str(os.getpid())); time.sleep(120)"
        return [sys.executable, "-c", code]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pid(path: str) -> int:
    with open(path) as f:
        return int(f.read())


def test_a_start_that_times_out_stops_its_engine(tmp_path) -> None:
    engine = Silent(str(tmp_path / "pid"))
    with pytest.raises(RuntimeError, match="did not answer /health"):
        engine.start(timeout=1.0)
    assert engine.proc is None and not _alive(_pid(str(tmp_path / "pid")))


def test_an_interrupted_start_stops_its_engine(tmp_path, monkeypatch) -> None:
    pidfile = str(tmp_path / "pid")
    engine = Silent(pidfile)
    calls = []

    def interrupt(*args, **kwargs):
        calls.append(args)
        if len(calls) >= 3 and os.path.exists(pidfile) and os.path.getsize(pidfile):
            raise KeyboardInterrupt  # the user's Ctrl-C while the engine loads
        raise OSError("connection refused")

    monkeypatch.setattr(urllib.request, "urlopen", interrupt)
    with pytest.raises(KeyboardInterrupt):
        engine.start(timeout=30.0)
    assert engine.proc is None and not _alive(_pid(pidfile))
