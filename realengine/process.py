"""A real engine as a child process on loopback: started in its own process group, ready once /health
answers 200, stopped with its whole group (TERM, then KILL). vLLM and llama.cpp's server differ only in
their command line, environment and how long they take to start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cache_dir() -> Path:
    """Where built models live: $LLMSLO_CACHE/realengine, else .cache/realengine in the checkout."""
    return Path(os.environ.get("LLMSLO_CACHE", REPO / ".cache")) / "realengine"


class EngineProcess:
    """One engine server; a context manager. Subclasses say how it is run (`argv`, `env`) and what it is."""

    name = "engine"
    poll_s = 0.5
    start_timeout_s = 300.0

    def __init__(self, port: int = 0, log_path: Path | None = None):
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.started_argv: list[str] = []  # the command line of the running process
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def available(self) -> str | None:
        """None when it can run here, else why not (with the fix)."""
        return None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self, timeout: float | None = None):
        timeout = self.start_timeout_s if timeout is None else timeout
        why = self.available()
        if why:
            raise RuntimeError(why)
        argv, env = self.argv(), self.env()
        self.started_argv = argv
        if self.log_path:
            self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                     stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy(timeout)
        except BaseException:  # a failed start, or one interrupted (Ctrl-C, a test's timeout): no orphaned engine
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting; log: {self.log_path}")
            try:  # engines answer 503 while they load
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(self.poll_s)
        raise RuntimeError(f"{self.name} did not answer /health within {timeout:.0f} s; log: {self.log_path}")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def _signal_group(self, pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """TERM the whole process group (after CONT, in case it was stopped), KILL what is left."""
        if self.proc is None:
            return
        try:
            pgid: int | None = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            self._signal_group(pgid, signal.SIGCONT)
            self._signal_group(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            if pgid is not None:
                self._signal_group(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if pgid is not None:  # children (vLLM's engine core and worker) share the group
            self._signal_group(pgid, signal.SIGKILL)
        if self._log:
            self._log.close()
            self._log = None
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_main(argv: Sequence[str] | None, description: str, port: int, size_flag: str, size: int,
               make: Callable[[int, int], EngineProcess], model: str) -> int:
    """Each engine module's `python -m`: `--port` and the one flag that sizes the engine (`size_flag`, an int),
    then `make(port, size)` served until interrupted."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--port", type=int, default=port)
    p.add_argument(size_flag, dest="size", type=int, default=size, metavar="N")
    a = p.parse_args(argv)
    return serve_until_interrupted(make(a.port, a.size), model)


def serve_until_interrupted(server: EngineProcess, model: str) -> int:
    """What each engine module's `python -m` does: start, print where, wait for Ctrl-C, stop."""
    server.start()
    print(json.dumps({"url": server.url, "model": model}), flush=True)
    try:
        while server.proc and server.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
