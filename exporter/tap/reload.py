"""Reloading the SLO files while the tap runs: polled every few seconds, and at once on SIGHUP.

Why: the rules slogen generates query the tap's histograms at the SLO thresholds, so a threshold
change must reach the running taps, and restarting the pod to get it would restart the engine
beside it (minutes of weight loading). A mounted ConfigMap changes in place (Kubernetes swaps its
`..data` link), so the tap watches the files' contents (their hash, llmslo.confighash: a poll
reads a few kilobytes in a thread) and reloads when the hash moves.

A reload is all or nothing, and only of files that are whole: changed contents are applied once two
reads SETTLE_S apart agree (a file rewritten in place is not applied half-written), a file with no YAML
document is refused as one caught mid-write, and the files are read as exporter.tap.slofiles allows
(regular files only, opened without blocking; bounded bytes; bounded YAML nodes, parsed in a thread so
the relay goes on). They are parsed and validated in full (the same loader as at start, then the
deadlines the flags imply) before anything changes. On any refusal the tap keeps the configuration it
runs on, logs it at WARNING (reason, file, what is wrong, fix) and counts it
(conventions.TAP_CONFIG_RELOAD_FAILURES); the same broken contents are not retried every poll
(SIGHUP retries), and the reloader outlives any error. On success `apply` swaps the configuration for
requests that arrive from then on; a request already in flight keeps the objective it was given when it
arrived. A `--slo` pipe (`--slo <(...)`) is read once, at start, and never reloaded (exporter.tap.cli).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from exporter.logs import TAP_LOGGER, event
from exporter.tap.background import cancel_and_wait
from exporter.tap.classes import SloConfig, SloConfigError, describe_changes, load_slo_config, read_slo_files
from exporter.tap.deadlines import DeadlineError
from llmslo.confighash import config_hash

DEFAULT_INTERVAL_S = 5.0
MIN_INTERVAL_S = 0.1
# Changed contents are applied once two reads this far apart agree: a file rewritten in place (truncated,
# then written) is not applied half-written. A ConfigMap's swap is atomic, so it costs that its reload comes
# this much later. After MAX_SETTLE_READS reads that all differ, the change is refused (counted, logged).
SETTLE_S = 1.0
MAX_SETTLE_READS = 10


def reload_interval(value: str) -> float:
    """`--slo-reload-interval`: 0 (only on SIGHUP) or at least MIN_INTERVAL_S seconds."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or not (seconds == 0 or seconds >= MIN_INTERVAL_S):
        raise argparse.ArgumentTypeError(f"{value!r} is not 0 or a number of seconds of at least {MIN_INTERVAL_S:g}")
    return seconds


def files_hash(paths: Sequence[str | Path]) -> str:
    """The hash load_slo_config would give the files under `paths` now ("" for none); SloConfigError if the
    tap may not read them (exporter.tap.slofiles: bounded, regular files)."""
    contents = [data for _, data in read_slo_files(paths)]
    return config_hash(contents) if contents else ""


def _load(paths: Sequence[str | Path]) -> SloConfig:
    return load_slo_config(paths, allow_empty=False)  # an empty file is one caught half-written


class SloReloader:
    """Watches the SLO files of one tap process and hands each valid new configuration to `apply`."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        current: Callable[[], SloConfig],
        apply: Callable[[SloConfig], list[str]],
        validate: Callable[[SloConfig], None],
        failed: Callable[[], None],
        interval_s: float = DEFAULT_INTERVAL_S,
        settle_s: float = SETTLE_S,
    ) -> None:
        """`current`: the configuration in force; `apply`: swap it in (returns the histogram families
        that started again with new edges); `validate`: raise DeadlineError if the flags do not fit it;
        `failed`: count one failed reload; `settle_s`: how long changed contents must stay the same."""
        self.paths = list(paths)
        self.current, self.apply, self.validate, self.failed = current, apply, validate, failed
        self.interval_s, self.settle_s = interval_s, settle_s
        self._wake = asyncio.Event()
        self._failed: str | None = None  # the contents (hash, or read error) last refused: not retried until they change
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and self.paths:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def request(self) -> None:
        """Check now, and retry contents that failed before (the SIGHUP handler)."""
        if not self.paths:
            event("tap_slo_not_reloaded", logging.WARNING, logger=TAP_LOGGER,
                  reason="no SLO files to reload (a --slo pipe is read once, at start)",
                  fix="give --slo a file or a directory to have changes reloaded")
        self._wake.set()

    async def _run(self) -> None:
        while True:
            forced = False
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that meets the wake
                async with asyncio.timeout(self.interval_s or None):
                    await self._wake.wait()
                forced = True
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.check(forced)
            except Exception as e:  # noqa: BLE001 - whatever a reload meets, the reloader keeps running
                error = f"the reload failed: {type(e).__name__}: {e}"
                self._refuse(error, forced, error + " (fix: report it; the next change or SIGHUP is tried again)",
                             "internal")

    async def _stable_hash(self, first: str) -> str:
        """The files' hash once two reads `settle_s` apart agree (a file still being written is not applied
        half-written); SloConfigError if they keep changing."""
        for _ in range(MAX_SETTLE_READS):
            await asyncio.sleep(self.settle_s)
            again = await asyncio.to_thread(files_hash, self.paths)
            if again == first:
                return first
            first = again
        raise SloConfigError(
            f"{', '.join(map(str, self.paths))}: the SLO files kept changing for {MAX_SETTLE_READS * self.settle_s:g} s;"
            f" the tap applies files that stay the same for {self.settle_s:g} s (fix: write each file whole, then "
            "leave it; SIGHUP retries)", "changing")

    async def check(self, forced: bool = False) -> bool:
        """Reload if the files' contents changed (or `forced`); True when a new configuration is in force."""
        old = self.current()
        key = ""  # what is refused: the contents' hash, or the read error's text
        try:
            key = now = await asyncio.to_thread(files_hash, self.paths)
            if now == old.hash:
                if forced:
                    event("tap_slo_unchanged", logger=TAP_LOGGER, hash=old.hash)
                self._failed = None
                return False
            if now == self._failed and not forced:
                return False
            key = now = await self._stable_hash(now)
            new = await asyncio.to_thread(_load, self.paths)  # in a thread: the relay goes on while it parses
            key = new.hash
            self.validate(new)
        except SloConfigError as e:
            return self._refuse(key or str(e), forced, str(e), e.reason)
        except DeadlineError as e:
            return self._refuse(key, forced, str(e), "deadlines")
        if new.hash != now:  # changed again while it was read: settle on the next check
            self._wake.set()
            return False
        self._failed = None
        changes = describe_changes(old, new)
        reset = self.apply(new)
        event("tap_slo_reloaded", logger=TAP_LOGGER, old_hash=old.hash, hash=new.hash,
              changes="; ".join(changes) or "none", histograms_restarted=",".join(reset) or "none")
        return True

    def _refuse(self, what: str, forced: bool, error: str, reason: str) -> bool:
        """Keep the configuration in force; count and log a failure once per broken contents (and on SIGHUP)."""
        if what == self._failed and not forced:
            return False
        self._failed = what
        self.failed()
        event("tap_slo_reload_failed", logging.WARNING, logger=TAP_LOGGER, reason=reason, hash=self.current().hash,
              error=error, kept="the configuration in force")
        return False
