"""Reloading the SLO files while the tap runs: polled every few seconds, and at once on SIGHUP.

Why: the rules slogen generates query the tap's histograms at the SLO thresholds, so a threshold
change must reach the running taps, and restarting the pod to get it would restart the engine
beside it (minutes of weight loading). A mounted ConfigMap changes in place (Kubernetes swaps its
`..data` link), so the tap watches the files' contents (their hash, llmslo.confighash: a poll
reads a few kilobytes in a thread) and reloads when the hash moves.

A reload is all or nothing: the files are read, parsed and validated in full (the same loader as
at start, then the deadlines the flags imply) before anything changes. On any error the tap keeps
the configuration it runs on, logs the error (file, SLO, field, fix) and counts it
(conventions.TAP_CONFIG_RELOAD_FAILURES); the same broken contents are not retried every poll
(SIGHUP retries). On success `apply` swaps the configuration for requests that arrive from then
on; a request already in flight keeps the objective it was given when it arrived.
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
from exporter.tap.classes import SloConfig, SloConfigError, describe_changes, expand_paths, load_slo_config
from exporter.tap.deadlines import DeadlineError
from llmslo.confighash import config_hash

DEFAULT_INTERVAL_S = 5.0
MIN_INTERVAL_S = 0.1


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
    """The hash load_slo_config would give the files under `paths` now ("" for none); OSError if unreadable."""
    contents = [p.read_bytes() for p in expand_paths(paths)]
    return config_hash(contents) if contents else ""


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
    ) -> None:
        """`current`: the configuration in force; `apply`: swap it in (returns the histogram families
        that started again with new edges); `validate`: raise DeadlineError if the flags do not fit it;
        `failed`: count one failed reload."""
        self.paths = list(paths)
        self.current, self.apply, self.validate, self.failed = current, apply, validate, failed
        self.interval_s = interval_s
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
        self._wake.set()

    async def _run(self) -> None:
        while True:
            forced = False
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s or None)
                forced = True
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self.check(forced)

    async def check(self, forced: bool = False) -> bool:
        """Reload if the files' contents changed (or `forced`); True when a new configuration is in force."""
        old = self.current()
        try:
            now = await asyncio.to_thread(files_hash, self.paths)
        except OSError as e:
            return self._refuse(f"unreadable: {e}", forced,
                                f"cannot read the SLO files ({e}); check the --slo path and the mounted ConfigMap")
        if now == old.hash:
            if forced:
                event("tap_slo_unchanged", logger=TAP_LOGGER, hash=old.hash)
            self._failed = None
            return False
        if now == self._failed and not forced:
            return False
        try:
            new = await asyncio.to_thread(load_slo_config, self.paths)
            self.validate(new)
        except (SloConfigError, DeadlineError) as e:
            return self._refuse(now, forced, str(e))
        except OSError as e:
            return self._refuse(now, forced, f"cannot read the SLO files ({e})")
        self._failed = None
        changes = describe_changes(old, new)
        reset = self.apply(new)
        event("tap_slo_reloaded", logger=TAP_LOGGER, old_hash=old.hash, hash=new.hash,
              changes="; ".join(changes) or "none", histograms_restarted=",".join(reset) or "none")
        return True

    def _refuse(self, what: str, forced: bool, error: str) -> bool:
        """Keep the configuration in force; count and log a failure once per broken contents (and on SIGHUP)."""
        if what == self._failed and not forced:
            return False
        self._failed = what
        self.failed()
        event("tap_slo_reload_failed", logging.ERROR, logger=TAP_LOGGER, hash=self.current().hash, error=error,
              kept="the configuration in force")
        return False
