"""A process supervisor for the local stack: start children, wait until they answer, always stop them all.

Each child runs in its own session, hence its own process group, so stopping it reaches anything it
spawned too. Stopping is SIGTERM to the group, a grace period, then SIGKILL. It happens on normal exit,
on exceptions, and from the atexit hook as a last resort; children are also asked (PR_SET_PDEATHSIG) to
receive SIGTERM if this process dies without running any of that (SIGKILL, a crash), so nothing outlives it.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

_PR_SET_PDEATHSIG = 1


class StartError(RuntimeError):
    """A child exited or never answered; the message carries the tail of its log."""


def fresh_dir(path: Path) -> Path:
    """`path`, emptied and created: a store started on it keeps no series or silences from a previous run."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def free_url() -> tuple[int, str]:
    """A free loopback port (free_port) and its http:// URL, for a server the demo starts on it."""
    port = free_port()
    return port, f"http://127.0.0.1:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port the OS says is free now (for programs that cannot report the port they bound).

    Chosen below the kernel's ephemeral range when there is room: the program binds it a moment later, and
    meanwhile any outgoing connection on the machine (a scrape, remote-write, the load generator) takes its
    source port from that range and could take this one first ("address already in use").
    """
    low = _ephemeral_low()
    if low > _FIXED_LOW + 1000:
        for _ in range(50):
            port = random.randrange(_FIXED_LOW, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_FIXED_LOW = 10000  # below: well-known and registered services' ports


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child must not load libraries
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM when the parent goes away, whatever the reason."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.proc.pid  # a session leader's group id is its pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


@dataclass
class Supervisor:
    """Owns every child process of the stack; `stop()` is idempotent and safe from any exit path."""

    log_dir: Path
    grace_s: float = 5.0
    children: list[Child] = field(default_factory=list)
    _atexit_registered: bool = False

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self._atexit_registered:
            atexit.register(self.stop_now)
            self._atexit_registered = True
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent, env={**os.environ, **(env or {})}, cwd=cwd,
            )
        child = Child(name, argv, proc, log_path)
        self.children.append(child)
        return child

    async def wait_http(self, child: Child, url: str, timeout_s: float = 30.0, ok=(200,)) -> None:
        """Poll `url` until it answers with a status in `ok`; StartError if the child exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline:
                if not child.alive():
                    raise StartError(f"{child.name} exited with status {child.proc.returncode} before {url} answered; "
                                     f"its log ({child.log_path}) ends:\n{child.log_tail()}")
                try:
                    async with session.get(url) as resp:
                        if resp.status in ok:
                            return
                        last = f"HTTP {resp.status}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    last = type(e).__name__
                await asyncio.sleep(0.1)
        raise StartError(f"{child.name} did not answer {url} within {timeout_s:.0f}s (last: {last}); "
                         f"its log ({child.log_path}) ends:\n{child.log_tail()}")

    def check_alive(self) -> None:
        """StartError naming the first child that has died (the stack is broken without it)."""
        for c in self.children:
            if not c.alive():
                raise StartError(f"{c.name} exited with status {c.proc.returncode}; its log ({c.log_path}) ends:\n"
                                 f"{c.log_tail()}")

    def _signal_groups(self, sig: int, children: list[Child]) -> None:
        for c in children:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(c.pgid, sig)

    def stop_now(self) -> None:
        """SIGTERM every group (newest first), wait up to the grace period, SIGKILL what is left, reap."""
        children = list(reversed(self.children))
        self._signal_groups(signal.SIGTERM, children)
        deadline = time.monotonic() + self.grace_s
        for c in children:
            with suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        # SIGKILL the group even when the leader exited: a grandchild may still hold it.
        self._signal_groups(signal.SIGKILL, children)
        for c in children:
            with suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=2)

    async def stop(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.stop_now)

    def process_groups(self) -> list[int]:
        return [c.pgid for c in self.children]


def live_processes_in_groups(pgids: list[int]) -> list[tuple[int, str]]:
    """(pid, command name) of every process still in one of these process groups, read from /proc."""
    wanted = set(pgids)
    found = []
    for stat in _proc_stats():
        if stat[3] in wanted and stat[2] != "Z":
            found.append((stat[0], stat[1]))
    return found


def lingering_in_groups(pgids: list[int], within_s: float = 10.0) -> list[tuple[int, str]]:
    """`live_processes_in_groups` once they have had `within_s` to go: a SIGKILLed process with a large
    address space (a real engine's torch worker) takes the kernel a moment to tear down; [] when all went."""
    deadline = time.monotonic() + within_s
    while True:
        left = live_processes_in_groups(pgids)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def live_children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the live (not zombie) processes whose parent is `pid`, read from /proc."""
    return [(s[0], s[1]) for s in _proc_stats() if s[4] == pid and s[2] != "Z"]


def _proc_stats() -> list[tuple[int, str, str, int, int]]:
    """(pid, comm, state, pgrp, ppid) of every process; /proc/PID/stat's comm may contain spaces and parens."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        head, _, tail = raw.rpartition(")")
        comm = head.partition("(")[2]
        fields = tail.split()
        # after comm: state ppid pgrp ...
        out.append((int(entry), comm, fields[0], int(fields[2]), int(fields[1])))
    return out
