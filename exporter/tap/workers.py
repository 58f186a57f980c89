"""`llmslo-exporter tap --workers N`: the tap in N processes on one port, for pods past one core.

One tap process relays on one core (docs/scaling.md: roughly 17,000 chunks a second). With
`--workers N` this parent process reserves the proxy port, starts N ordinary tap processes that
all listen on it with SO_REUSEPORT (the kernel spreads new connections over them), and serves
the one /metrics: on each scrape it reads every worker's metrics from the worker's abstract unix
socket (nothing is written to the filesystem, which stays read-only) and merges them. Counters
and histograms are summed, series by series, which is exact. Gauges (the admission gate's, with
`--admission`: each worker reads the engine on its own) are never summed: each worker's value is
kept with a `worker` label, so N workers' seats do not read N times the engine's. Each worker's gate
decides on its own, so it is told it is one of N (`--admission-taps`): it counts what it admitted since
its last reading, and its requests in flight, N times, and N workers admit what one process would. A worker that
dies is started again, and what it had counted when last scraped stays in the sum, so the
counters never go down (what it counted after that scrape is lost); its gauges go with it, and so do
its histogram series of an earlier configuration (a `buckets` value no live worker shows: the reload
that changed the edges ended them, as it does in one process).
SIGTERM is passed on and each worker drains its own streams; SIGHUP is passed on and each worker
checks its SLO files (exporter.tap.reload), as each also does every --slo-reload-interval.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from exporter.logs import TAP_LOGGER, event
from exporter.tap.addresses import format_host_port, metrics_address
from exporter.tap.options import add_arguments
from llmslo import conventions as C
from llmslo.gofloat import client_float

START_TIMEOUT_S = 20.0
RESTART_DELAY_S = 1.0


@dataclass
class Worker:
    index: int
    socket_name: str  # abstract unix socket: "@name" on the command line, "\0name" to connect
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    last_page: str = ""  # its metrics as last scraped

    @property
    def address(self) -> str:
        address = metrics_address(f"unix:{self.socket_name}")  # the path the worker itself serves on
        assert isinstance(address, str)
        return address


# Options each worker gets its own value for; every other option is passed on as the parent got it.
_PER_WORKER = frozenset({"listen", "metrics_listen", "workers", "reuse_port", "admission_taps"})


def worker_argv(args: argparse.Namespace, port: int, w: Worker) -> list[str]:
    """The command line of one worker: this tap's settings, on the shared port, metrics on its socket.

    Generic over the tap's option list (exporter.tap.options.add_arguments), so an option added
    there reaches the workers without being named here."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    host = args.listen[0]
    argv = [
        sys.executable, "-m", "exporter.tap", "--listen", format_host_port(host, port), "--reuse-port",
        "--metrics-listen", f"unix:{w.socket_name}",
    ]
    if args.admission:  # each worker's gate admits on its own: it counts its admissions for all (exporter.tap.admission)
        argv += ["--admission-taps", str(getattr(args, "admission_taps", 1) * args.workers)]
    for action in parser._actions:
        if not action.option_strings or action.dest in _PER_WORKER:
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default and not action.required:
            continue
        flag = next(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


# Family types whose series add up across workers; every other type (gauge, untyped) is kept per worker,
# but for the gauges in SUMMED_GAUGES: counts of what live workers hold now, which add up too (and which
# a worker that died no longer holds, so they are taken from live workers only).
SUMMED_TYPES = frozenset({"counter", "histogram"})
SUMMED_GAUGES = frozenset({C.TAP_IN_FLIGHT_LATE.name})
# Info gauges (always 1): one series per distinct label set any live worker has, without a worker label
# (two workers on the same SLO files show one `llm_tap_config_info{hash}`; mid-reload, both hashes).
UNION_GAUGES = frozenset({C.TAP_CONFIG_INFO.name})
LABEL_WORKER = "worker"


@dataclass
class _Block:
    """One family as the workers wrote it: its HELP/TYPE lines and its series, in first-seen order."""

    header: list[str]
    summed: bool = True  # until a TYPE line says otherwise
    live_only: bool = False  # a SUMMED_GAUGES family: summed over live workers only
    union: bool = False  # a UNION_GAUGES family: each live worker's series once
    series: dict[str, float] = field(default_factory=dict)  # `name{labels}` -> summed value
    kept: dict[str, str] = field(default_factory=dict)  # `name{labels,worker="i"}` -> that worker's value


def with_worker_label(key: str, worker: str) -> str:
    """`name{labels}` with the worker's label added last."""
    if key.endswith("}"):
        return f'{key[:-1]},{LABEL_WORKER}="{worker}"}}'
    return f'{key}{{{LABEL_WORKER}="{worker}"}}'


_BUCKETS = re.compile(rf'^([a-zA-Z_:][a-zA-Z0-9_:]*?)(?:_bucket|_sum|_count)\{{(?:.*,)?{C.LABEL_BUCKETS}="([^"]*)"', re.M)


def _live_bucket_sets(texts: list[str], workers: list[str | None] | None) -> frozenset[tuple[str, str]] | None:
    """(histogram, LABEL_BUCKETS value) on the live workers' pages; None when no page is a live worker's."""
    live = [t for i, t in enumerate(texts) if workers is None or workers[i] is not None]
    return frozenset(m for t in live for m in _BUCKETS.findall(t)) if live else None


def merge_expositions(texts: Iterable[str], workers: Iterable[str | None] | None = None) -> str:
    """The workers' expositions merged: counters and histograms summed series by series, gauges kept
    per worker with a `worker` label (`workers[i]` names the worker of `texts[i]`, by default its
    position; None: no live worker, e.g. the counts of workers that died, whose gauges are left out).

    All workers run the same code, so their pages have the same families in the same spelling;
    the merge keeps that spelling (HELP and TYPE lines as written) and adds up each series, also
    those only some workers have (a model only one of them has served). `*_created` families, a
    timestamp per series that sums to nonsense, are left out (the tap disables them anyway).
    """
    blocks: dict[str, _Block] = {}
    pages, owners = list(texts), (list(workers) if workers is not None else None)
    live_sets = _live_bucket_sets(pages, owners)
    names = iter(owners) if owners is not None else None
    for position, text in enumerate(pages):
        worker = next(names) if names is not None else str(position)
        block: _Block | None = None
        for line in text.splitlines():
            if line.startswith("# "):
                parts = line.split(" ", 3)
                if len(parts) < 3:
                    continue
                name = parts[2]
                block = None if name.endswith("_created") else blocks.setdefault(name, _Block([]))
                if block is not None and parts[1] == "TYPE" and len(parts) == 4:
                    block.live_only = name in SUMMED_GAUGES
                    block.union = name in UNION_GAUGES
                    block.summed = parts[3].strip() in SUMMED_TYPES or block.live_only
                if block is not None and len(block.header) < 2 and line not in block.header:
                    block.header.append(line)
                continue
            if block is None or not line.strip():
                continue
            key, _, value = line.rpartition(" ")
            if (block.live_only or block.union) and worker is None:
                continue
            if worker is None and live_sets is not None and (m := _BUCKETS.match(key)) and m.groups() not in live_sets:
                continue  # a dead worker's series of an earlier configuration's edges
            if block.union:
                block.kept[key] = value
                continue
            if block.summed:
                block.series[key] = block.series.get(key, 0.0) + float(value)
            elif worker is not None:
                block.kept[with_worker_label(key, worker)] = value
    out: list[str] = []
    for block in blocks.values():
        if (not block.summed and not block.kept) or (block.live_only and not block.series):
            continue  # a gauge only workers that died had
        out += block.header
        out += [f"{key} {client_float(value)}" for key, value in block.series.items()]
        out += [f"{key} {value}" for key, value in block.kept.items()]
    return "\n".join(out) + "\n" if out else ""


class Parent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        prefix = f"@llmslo-tap-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.workers = [Worker(i, f"{prefix}-{i}") for i in range(args.workers)]
        self.port = 0
        self.stopping = False
        # What workers that died had counted when last scraped: kept in the sum, so that the
        # summed counters never go down (Prometheus would take the drop for a reset of them all).
        self.retired = ""

    async def _spawn(self, w: Worker) -> None:
        w.process = await asyncio.create_subprocess_exec(*worker_argv(self.args, self.port, w), stdin=asyncio.subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # ready once its metrics socket answers
            try:
                _, writer = await asyncio.open_unix_connection(w.address)
                writer.close()
                return
            except OSError:
                if w.process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tap worker {w.index} did not start (exit status {w.process.returncode})") from None
                await asyncio.sleep(0.05)

    async def _supervise(self, w: Worker) -> None:
        while not self.stopping:
            assert w.process is not None
            code = await w.process.wait()
            if self.stopping:
                return
            w.restarts += 1
            self.retired, w.last_page = merge_expositions([self.retired, w.last_page], [None, None]), ""
            event("tap_worker_exited", logging.WARNING, logger=TAP_LOGGER, worker=w.index, status=code, restarts=w.restarts)
            await asyncio.sleep(RESTART_DELAY_S)
            try:
                await self._spawn(w)
            except RuntimeError as e:
                if not self.stopping:  # else it was stopped while starting: nothing failed
                    event("tap_worker_restart_failed", logging.ERROR, logger=TAP_LOGGER, worker=w.index, error=e)

    async def _scrape(self, w: Worker) -> str:
        connector = aiohttp.UnixConnector(path=w.address)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5)) as s:
            async with s.get("http://worker/metrics") as r:
                return await r.text()

    async def metrics(self, _: web.Request) -> web.Response:
        texts = await asyncio.gather(*(self._scrape(w) for w in self.workers), return_exceptions=True)
        for w, t in zip(self.workers, texts, strict=True):
            if isinstance(t, BaseException):
                event("tap_worker_scrape_failed", logging.WARNING, logger=TAP_LOGGER, worker=w.index,
                      error=type(t).__name__)
            else:
                w.last_page = t
        live = [(str(w.index), t) for w, t in zip(self.workers, texts, strict=True) if isinstance(t, str)]
        body = merge_expositions([self.retired, *(t for _, t in live)], [None, *(i for i, _ in live)])
        return web.Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def run(self) -> int:
        host, port = self.args.listen
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        hold = socket.socket(info[0], socket.SOCK_STREAM)  # holds the port; never listens
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_workers)
        runner = web.AppRunner(web.Application(), access_log=None)
        try:
            hold.bind(info[4])
            self.port = hold.getsockname()[1]
            await asyncio.gather(*(self._spawn(w) for w in self.workers))
            app = web.Application()
            app.router.add_get("/metrics", self.metrics)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            where = self.args.metrics_listen
            site = web.UnixSite(runner, where) if isinstance(where, str) else web.TCPSite(runner, *where, reuse_address=True)
            await site.start()
            metrics_port = runner.addresses[0][1] if not isinstance(where, str) else 0
            event(
                "tap_listening", logger=TAP_LOGGER, proxy=f"http://{format_host_port(host, self.port)}",
                metrics=(f"unix:{where}" if isinstance(where, str) else f"http://{format_host_port(where[0], metrics_port)}")
                + "/metrics",
                upstream=self.args.upstream, workers=len(self.workers),
            )
            supervisors = [asyncio.create_task(self._supervise(w)) for w in self.workers]
            await stop.wait()
        except (OSError, RuntimeError) as e:
            print(f"llmslo-exporter tap: error: {e} (fix: free the port or choose another with --listen / "
                  "--metrics-listen)", file=sys.stderr)
            await self._stop_workers()
            return 2
        finally:
            hold.close()
        event("tap_stopping", logger=TAP_LOGGER, grace_s=self.args.shutdown_grace, workers=len(self.workers))
        await self._stop_workers()
        for task in supervisors:
            task.cancel()
        await runner.cleanup()
        return 0

    def _reload_workers(self) -> None:
        """SIGHUP: every worker checks its SLO files now (each also polls them on its own)."""
        for w in self.workers:
            if w.process is not None and w.process.returncode is None:
                w.process.send_signal(signal.SIGHUP)

    async def _stop_workers(self) -> None:
        self.stopping = True
        running = [w.process for w in self.workers if w.process is not None and w.process.returncode is None]
        for p in running:
            p.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), self.args.shutdown_grace + 5)
        except asyncio.TimeoutError:
            for p in running:
                if p.returncode is None:
                    p.kill()
            await asyncio.gather(*(p.wait() for p in running))


def run_workers(args: argparse.Namespace) -> int:
    """Run the parent until SIGTERM/SIGINT; exit status 2 when the workers cannot start."""
    return asyncio.run(Parent(args).run())
