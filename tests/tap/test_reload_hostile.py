"""The SLO hot reload under the attacks of issue 34, against the real CLI process (`python -m exporter.tap`).

Each test stages one attack on the file the tap reloads and checks what the tap must do: apply only a whole,
valid configuration (no request falls into the implicit `default` class), refuse what it may not read without
blocking or reading without end (a FIFO, `/dev/zero`, a 1 MiB file of tiny YAML nodes), count and log every
refusal at WARNING, keep reloading afterwards, stay under its container's memory limit, and exit on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from exporter.tap.classes import SloConfigError, load_slo_config
from exporter.tap.slofiles import MAX_FILE_BYTES, MAX_NODES, SloSourceError, read_source
from llmslo import conventions as C
from llmslo.confighash import config_hash

from .conftest import ROOT, spawn_upstream
from .test_reload import CHAT, SLO, Tap, page, value

GOOD, NEW = SLO.format(ttft="4"), SLO.format(ttft="1.25")
HALF = NEW[: NEW.index("slos:\n") + len("slos:\n")]  # a prefix of NEW that is valid YAML, with no SLO in it
MANIFEST = ROOT / "slogen/kustomize/examples/inference/deployment-vllm.yaml"


def _tap_memory_limit() -> int:
    """`resources.limits.memory` of the `tap` container in the shipped example deployment, in bytes."""
    doc = yaml.safe_load(MANIFEST.read_text())
    [tap] = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "tap"]
    quantity = tap["resources"]["limits"]["memory"]
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]]


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


async def _requests(tap: Tap, n: int = 1 << 30, for_s: float = 1e9, every_s: float = 0.05) -> int:
    """Up to `n` streamed requests, one after another, for at most `for_s` seconds; how many were made."""
    body = json.dumps({"model": "chat-a", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    made, end = 0, time.monotonic() + for_s
    async with aiohttp.ClientSession() as s:
        while made < n and time.monotonic() < end:
            async with s.post(tap.url + CHAT, data=body, headers={"x-test-chunks": "2"}) as r:
                assert r.status == 200
                await r.read()
            made += 1
            await asyncio.sleep(every_s)
    return made


def _check(tap: Tap, hash_: str, failures: int, requests: int | None = None) -> dict:
    now = asyncio.run(page(tap))
    assert value(now, C.TAP_CONFIG_INFO.name, hash=hash_) == 1, now
    assert value(now, C.TAP_CONFIG_RELOAD_FAILURES.name) == failures
    assert value(now, C.TAP_REQUESTS.name, slo_class="default") == 0  # none fell out of the configured classes
    if requests is not None:
        assert value(now, C.TAP_REQUESTS.name, slo_class="interactive") == requests
    return now


def _swap(link: Path, target: str | Path) -> None:
    """Point `link` at `target` atomically (as the kubelet swaps `..data`)."""
    tmp = link.with_name(link.name + ".tmp")
    tmp.symlink_to(target)
    os.replace(tmp, link)


def test_a_file_rewritten_in_place_is_never_applied_half_written(tmp_path: Path) -> None:
    """Truncated, then written in two parts: a valid prefix for 0.5 s (shorter than the settle time, so never
    applied), and an empty file held 2.5 s (longer: refused as empty, once). Requests made meanwhile all keep
    their class; the whole new file is then applied."""
    upstream = spawn_upstream()
    slo = tmp_path / "chat.yaml"
    slo.write_text(GOOD)
    tap = Tap(upstream.url, slo, "--slo-reload-interval", "0.2")
    try:
        assert load_slo_config([slo]).class_names == ("interactive",)
        assert yaml.safe_load(HALF)["slos"] is None  # valid YAML: only its incompleteness is wrong
        seen = len(tap.lines)
        with slo.open("w") as f:  # the attack: truncate, write a part, then the rest later
            f.write(HALF)
            f.flush()
            made = asyncio.run(_requests(tap, for_s=0.5))
            f.seek(0)
            f.truncate()
            f.flush()
            made += asyncio.run(_requests(tap, for_s=2.5))
            refused = tap.wait_for("event=tap_slo_reload_failed", seen)
            f.write(NEW)
        assert "level=WARNING" in refused and "reason=empty" in refused and str(slo) in refused and "fix:" in refused
        tap.wait_for("event=tap_slo_reloaded", seen)
        assert not any(config_hash([HALF]) in line for line in tap.lines)
        _check(tap, config_hash([NEW]), failures=1, requests=made)
    finally:
        tap.stop()
        upstream.stop()


def test_a_pipe_is_read_once_at_start_and_never_repolled(tmp_path: Path) -> None:
    """`--slo <(cat file)`: the tap runs on what the pipe held, polls do not empty it, SIGHUP says why not."""
    upstream = spawn_upstream()
    r, w = os.pipe()
    os.write(w, GOOD.encode())
    os.close(w)
    tap = Tap(upstream.url, Path(f"/dev/fd/{r}"), "--slo-reload-interval", "0.2", pass_fds=(r,))
    os.close(r)
    try:
        note = tap.wait_for("event=tap_slo_not_reloaded")
        assert "level=WARNING" in note and f"/dev/fd/{r}" in note
        time.sleep(1.0)  # five polls' time
        seen = len(tap.lines)
        tap.popen.send_signal(signal.SIGHUP)
        tap.wait_for("event=tap_slo_not_reloaded", seen)
        asyncio.run(_requests(tap, 3, every_s=0))
        _check(tap, config_hash([GOOD]), failures=0, requests=3)
    finally:
        tap.stop()
        upstream.stop()


def test_a_pipe_with_workers_is_refused_at_start(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.write(w, GOOD.encode())
    os.close(w)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--upstream", "http://127.0.0.1:9", "--slo", f"/dev/fd/{r}",
             "--workers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60, pass_fds=(r,))
    finally:
        os.close(r)
    assert done.returncode == 2
    assert f"--slo /dev/fd/{r} is a pipe" in done.stderr and "fix: give a file or a directory" in done.stderr


def test_a_million_tiny_nodes_are_refused_under_the_pods_memory_limit(tmp_path: Path) -> None:
    """1 MiB of `{}` nodes (the most a ConfigMap holds) is refused before it is composed; a file just inside
    the node budget is composed, and the tap's peak RSS stays under the shipped manifest's limit throughout."""
    upstream = spawn_upstream()
    slo = tmp_path / "slos" / "chat.yaml"
    slo.parent.mkdir()
    slo.write_text(GOOD)
    tap = Tap(upstream.url, slo.parent, "--slo-reload-interval", "0.2")
    try:
        seen = len(tap.lines)
        head = 'version: "prometheus/v1"\nservice: "chat"\nslos: ['
        tiny = head + "{}," * ((MAX_FILE_BYTES - len(head) - 3) // 3) + "{}]\n"
        assert len(tiny) <= MAX_FILE_BYTES
        slo.with_name("tiny.yaml").write_text(tiny)
        refused = tap.wait_for("event=tap_slo_reload_failed", seen)
        assert "level=WARNING" in refused and "reason=too_many_nodes" in refused and "tiny.yaml" in refused
        _check(tap, config_hash([GOOD]), failures=1)
        seen = len(tap.lines)
        within = head + "{}," * (MAX_NODES - 100) + "{}]\n"  # as many nodes as the budget lets through
        slo.with_name("tiny.yaml").write_text(within)
        tap.wait_for("event=tap_slo_reloaded", seen)
        asyncio.run(_requests(tap, 3, every_s=0))
        limit = _tap_memory_limit()
        assert _peak_rss(tap.popen.pid) < limit * 0.75, (_peak_rss(tap.popen.pid), limit)
    finally:
        tap.stop()
        upstream.stop()


def test_a_path_swapped_to_dev_zero_is_refused_and_later_changes_still_apply(tmp_path: Path) -> None:
    upstream = spawn_upstream()
    (tmp_path / "v1.yaml").write_text(GOOD)
    (tmp_path / "v2.yaml").write_text(NEW)
    link = tmp_path / "chat.yaml"
    link.symlink_to("v1.yaml")
    tap = Tap(upstream.url, link, "--slo-reload-interval", "0.2")
    try:
        seen = len(tap.lines)
        _swap(link, "/dev/zero")
        refused = tap.wait_for("event=tap_slo_reload_failed", seen)
        assert "level=WARNING" in refused and "reason=not_regular" in refused and "character device" in refused
        time.sleep(1.0)  # more polls of the same: counted once, and the reloader is still alive
        _check(tap, config_hash([GOOD]), failures=1)
        seen = len(tap.lines)
        _swap(link, "v2.yaml")
        tap.wait_for("event=tap_slo_reloaded", seen)
        _check(tap, config_hash([NEW]), failures=1)
        seen = len(tap.lines)
        (tmp_path / "v2.yaml").write_text(GOOD)
        tap.popen.send_signal(signal.SIGHUP)
        tap.wait_for("event=tap_slo_reloaded", seen)
        _check(tap, config_hash([GOOD]), failures=1)
        assert _peak_rss(tap.popen.pid) < _tap_memory_limit() * 0.75
    finally:
        tap.stop()
        upstream.stop()


def test_a_path_swapped_to_a_fifo_is_refused_and_sigterm_still_stops_the_tap(tmp_path: Path) -> None:
    upstream = spawn_upstream()
    (tmp_path / "v1.yaml").write_text(GOOD)
    os.mkfifo(tmp_path / "fifo")
    link = tmp_path / "chat.yaml"
    link.symlink_to("v1.yaml")
    tap = Tap(upstream.url, link, "--slo-reload-interval", "0.2")
    try:
        seen = len(tap.lines)
        _swap(link, "fifo")  # no writer: an open() without O_NONBLOCK would wait for ever
        refused = tap.wait_for("event=tap_slo_reload_failed", seen)
        assert "reason=not_regular" in refused and "pipe" in refused
        seen = len(tap.lines)
        tap.popen.send_signal(signal.SIGHUP)
        tap.wait_for("event=tap_slo_reload_failed", seen)  # retried on SIGHUP, refused again: not stuck
        _check(tap, config_hash([GOOD]), failures=2)
    finally:
        tap.popen.send_signal(signal.SIGTERM)
        assert tap.popen.wait(timeout=15) == 0
        upstream.stop()


# ---------------------------------------------------------------------------------------------- the reader
def _in_thread(fn, timeout: float = 5.0) -> BaseException | None:  # type: ignore[no-untyped-def]
    """What `fn()` raised, from a thread that must end within `timeout` (an open() that blocks would not)."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:  # noqa: BLE001
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert out, "blocked"
    return out[0]


def test_the_reader_refuses_without_blocking_and_reads_at_most_its_limit(tmp_path: Path) -> None:
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    e = _in_thread(lambda: read_source(fifo))
    assert isinstance(e, SloSourceError) and e.reason == "not_regular" and "pipe" in str(e)
    e = _in_thread(lambda: read_source(Path("/dev/zero")))
    assert isinstance(e, SloSourceError) and "character device" in str(e)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(SloSourceError, match="larger than"):
        read_source(big)
    # In a directory, a FIFO named *.yaml is refused, not skipped (its SLOs would vanish without a word).
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.yaml").write_text(GOOD)
    os.mkfifo(d / "b.yaml")
    e = _in_thread(lambda: load_slo_config([d]))
    assert isinstance(e, SloConfigError) and e.reason == "not_regular" and "b.yaml" in str(e)


def test_an_empty_file_is_refused_only_on_reload(tmp_path: Path) -> None:
    f = tmp_path / "chat.yaml"
    f.write_text("# nothing yet\n")
    assert load_slo_config([f]).class_names == ("default",)  # at start: no SLOs, as before
    with pytest.raises(SloConfigError, match="empty") as e:
        load_slo_config([f], allow_empty=False)
    assert e.value.reason == "empty"
