"""An SLO change reaches a running tap: the real CLI process reloads its files while streams flow.

The SLO files sit in a directory laid out as the kubelet mounts a ConfigMap (`chat.yaml` -> `..data/chat.yaml`,
`..data` -> a timestamped directory, swapped atomically on update). A stream is in flight when the TTFT
objective drops from 4 s to 1.25 s: it is relayed to the end and judged by the objective it started with
(its first token at 2.2 s is good), the next request by the new one (bad), the TTFT histogram serves the new
`le="1.25"` edge (in a new series set, `buckets` the new edges' hash: the old set is gone), and `llm_tap_config_info` carries the new files'
hash (the one slogen puts in the rules and the ConfigMap). A broken file is refused whole: the old objective
stays, the failure is counted and logged with the file; SIGHUP retries at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmslo import conventions as C
from llmslo.confighash import config_hash

from .conftest import ROOT, spawn_upstream

CHAT = "/v1/chat/completions"
SLO = """\
version: "prometheus/v1"
service: "chat"
slos:
  - name: "goodput"
    objective: 95
    sli:
      plugin:
        id: "llmslo/goodput"
        options: {{slo_class: "interactive", ttft: "{ttft}", tpot: "0.5", models: "chat-*"}}
  - name: "ttft"
    objective: 99
    sli:
      plugin:
        id: "llmslo/latency"
        options: {{metric: "ttft", threshold: "{ttft}", source: "tap", slo_class: "interactive"}}
"""
FIRST_TOKEN_MS = 2200  # good under the 4 s objective, bad under 1.25 s, with a wide margin on either side


class ConfigMapDir:
    """A directory updated the way the kubelet updates a mounted ConfigMap."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.version = 0
        path.mkdir()

    def write(self, files: dict[str, str]) -> None:
        self.version += 1
        data = self.path / f"..2026_01_01_00_00_{self.version:02d}.000000000"
        data.mkdir()
        for name, text in files.items():
            (data / name).write_text(text)
        tmp = self.path / "..data_tmp"
        tmp.symlink_to(data.name)
        old = os.readlink(self.path / "..data") if (self.path / "..data").is_symlink() else None
        os.replace(tmp, self.path / "..data")
        for name in files:
            link = self.path / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        if old:
            for f in (self.path / old).iterdir():
                f.unlink()
            (self.path / old).rmdir()


class Tap:
    """`python -m exporter.tap` with its log lines collected as they come."""

    def __init__(self, upstream: str, slo: Path, *extra: str, pass_fds: tuple[int, ...] = ()) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--upstream", upstream, "--slo", str(slo), "--models-refresh", "0", *extra],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, pass_fds=pass_fds)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        line = self.wait_for("event=tap_listening")
        self.url = re.search(r"proxy=(\S+)", line).group(1)
        self.metrics = re.search(r"metrics=(\S+)", line).group(1)

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, after: int = 0, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                if text in line:
                    return line
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} in the tap's log:\n{''.join(self.lines)}")

    def stop(self) -> None:
        self.popen.send_signal(signal.SIGTERM)
        self.popen.wait(timeout=20)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(page: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in page.items() if n == name and set(labels.items()) <= ls)


async def page(tap: Tap) -> dict:
    async with aiohttp.ClientSession() as s, s.get(tap.metrics) as r:
        return samples(await r.text())


async def stream(session: aiohttp.ClientSession, tap: Tap, rid: str, chunks: int = 60) -> list[bytes]:
    body = json.dumps({"model": "chat-a", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"x-request-id": rid, "x-test-chunks": str(chunks), "x-test-first-ms": str(FIRST_TOKEN_MS),
               "x-test-delay-ms": "20", "content-type": "application/json"}
    async with session.post(tap.url + CHAT, data=body, headers=headers) as r:
        assert r.status == 200
        return [line async for line in r.content if line.startswith(b"data: ")]


def test_threshold_change_reaches_a_running_tap_without_dropping_a_stream(tmp_path: Path) -> None:
    upstream = spawn_upstream()
    slos = ConfigMapDir(tmp_path / "slos")
    old_text, new_text = SLO.format(ttft="4"), SLO.format(ttft="1.25")
    slos.write({"chat.yaml": old_text})
    tap = Tap(upstream.url, slos.path, "--slo-reload-interval", "0.2")
    try:
        async def go() -> None:
            before = await page(tap)
            assert value(before, C.TAP_CONFIG_INFO.name, hash=config_hash([old_text])) == 1
            ttft_bucket = C.TAP_TTFT.name + "_bucket"
            assert value(before, ttft_bucket, le="4.0") == 0 and not value(before, ttft_bucket, le="1.25")
            assert not any(n == ttft_bucket and ("le", "1.25") in ls for n, ls in before)
            old_ids = {dict(ls)[C.LABEL_BUCKETS] for n, ls in before if n.startswith(C.TAP_TTFT.name + "_")}
            assert len(old_ids) == 1
            async with aiohttp.ClientSession() as session:
                in_flight = asyncio.ensure_future(stream(session, tap, "during"))
                await asyncio.sleep(0.5)  # the request has arrived (its objective is set), its first token has not
                seen = len(tap.lines)
                slos.write({"chat.yaml": new_text})
                reloaded = await asyncio.to_thread(tap.wait_for, "event=tap_slo_reloaded", seen)
                assert not in_flight.done(), "the reload came after the stream ended; the test proves nothing"
                events = await in_flight
                after = await stream(session, tap, "after")
            # Not dropped: every chunk and the end of the stream reached the client.
            assert len(events) >= 60 and events[-1] == b"data: [DONE]\n"
            assert "ttft=4s" in reloaded and "ttft=1.25s" in reloaded and C.TAP_TTFT.name in reloaded
            assert len(after) >= 60
            now = await page(tap)
            # The new files' hash, the same slogen computes for the rules and the ConfigMap.
            assert value(now, C.TAP_CONFIG_INFO.name, hash=config_hash([new_text])) == 1
            assert value(now, C.TAP_CONFIG_INFO.name) == 1  # one configuration, the old one gone
            # The in-flight stream kept its 4 s objective (good); the next one got 1.25 s (bad).
            labels = {"model": "chat-a", "slo_class": "interactive"}
            assert value(now, C.TAP_REQUESTS.name, outcome=C.OUTCOME_OK, **labels) == 2
            assert value(now, C.GOODPUT_REQUESTS.name, **labels) == 1
            # The new bucket edge is served, in a new series set (count and buckets together, issue 35): the
            # old set is gone from the page; both requests ended after the reload, above 1.25 s.
            new_ids = {dict(ls)[C.LABEL_BUCKETS] for n, ls in now if n.startswith(C.TAP_TTFT.name + "_")}
            assert len(new_ids) == 1 and new_ids.isdisjoint(old_ids)
            assert (ttft_bucket, frozenset({*labels.items(), (C.LABEL_BUCKETS, *new_ids), ("le", "1.25")})) in now
            assert value(now, C.TAP_TTFT.count(), **labels) == 2
            assert value(now, ttft_bucket, le="1.25", **labels) == 0
            assert value(now, ttft_bucket, le="3.0", **labels) == 2
            assert value(now, C.TAP_CONFIG_RELOAD_FAILURES.name) == 0

        asyncio.run(go())
    finally:
        tap.stop()
        upstream.stop()


def test_a_broken_file_is_refused_whole_and_sighup_retries(tmp_path: Path) -> None:
    upstream = spawn_upstream()
    slos = ConfigMapDir(tmp_path / "slos")
    good = SLO.format(ttft="4")
    slos.write({"chat.yaml": good})
    tap = Tap(upstream.url, slos.path, "--slo-reload-interval", "0.2")
    try:
        seen = len(tap.lines)
        # Valid YAML, but a threshold the plugin contract refuses: nothing of it may take effect.
        slos.write({"chat.yaml": SLO.format(ttft="-1")})
        failed = tap.wait_for("event=tap_slo_reload_failed", seen)
        assert "chat.yaml" in failed and "ttft" in failed
        time.sleep(1.0)  # several polls of the same broken contents: counted and logged once
        assert sum("tap_slo_reload_failed" in line for line in tap.lines) == 1

        async def check(expect_hash: str, failures: int) -> None:
            now = await page(tap)
            assert value(now, C.TAP_CONFIG_INFO.name, hash=expect_hash) == 1
            assert value(now, C.TAP_CONFIG_RELOAD_FAILURES.name) == failures

        asyncio.run(check(config_hash([good]), 1))
        # SIGHUP retries the same broken contents at once: refused again, counted again.
        seen = len(tap.lines)
        tap.popen.send_signal(signal.SIGHUP)
        tap.wait_for("event=tap_slo_reload_failed", seen)
        asyncio.run(check(config_hash([good]), 2))
        # With polling off (0), a change waits for SIGHUP.
        tap.stop()
        slos.write({"chat.yaml": good})
        tap = Tap(upstream.url, slos.path, "--slo-reload-interval", "0")
        fixed = SLO.format(ttft="1.25")
        slos.write({"chat.yaml": fixed})
        time.sleep(1.0)
        asyncio.run(check(config_hash([good]), 0))
        seen = len(tap.lines)
        tap.popen.send_signal(signal.SIGHUP)
        tap.wait_for("event=tap_slo_reloaded", seen)
        asyncio.run(check(config_hash([fixed]), 0))
    finally:
        tap.stop()
        upstream.stop()


def test_workers_reload_on_the_parents_sighup_and_show_one_hash(tmp_path: Path) -> None:
    """`--workers 2` with polling off: SIGHUP to the parent reaches both workers; the merged page then has
    one llm_tap_config_info series, the new hash, with no worker label (both run on the same files)."""
    upstream = spawn_upstream()
    slos = ConfigMapDir(tmp_path / "slos")
    old_text, new_text = SLO.format(ttft="4"), SLO.format(ttft="1.25")
    slos.write({"chat.yaml": old_text})
    tap = Tap(upstream.url, slos.path, "--slo-reload-interval", "0", "--workers", "2", "--shutdown-grace", "2")
    try:
        deadline = time.monotonic() + 30  # both workers up (their lines may trail the parent's)
        while sum("event=tap_worker_listening" in ln for ln in tap.lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        info = C.TAP_CONFIG_INFO.name
        assert {ls for (n, ls), _ in asyncio.run(page(tap)).items() if n == info} == {
            frozenset({("hash", config_hash([old_text]))})}
        seen = len(tap.lines)
        slos.write({"chat.yaml": new_text})
        tap.popen.send_signal(signal.SIGHUP)
        first = tap.wait_for("event=tap_slo_reloaded", seen)
        tap.wait_for("event=tap_slo_reloaded", tap.lines.index(first) + 1)  # the second worker's
        now = asyncio.run(page(tap))
        assert {ls for (n, ls), _ in now.items() if n == info} == {frozenset({("hash", config_hash([new_text]))})}
        assert value(now, C.TAP_TTFT.name + "_bucket", le="1.25") == 0  # every worker serves the new edge
        assert any(n == C.TAP_TTFT.name + "_bucket" and ("le", "1.25") in ls for (n, ls) in now)
    finally:
        tap.stop()
        upstream.stop()
