"""`--once` over saved pages runs its cycle without an event loop (exporter/cycle.py: PageCycle.collect_files):
the same snapshot as the collector's cycle on the loop, target by target, and a hung file still only its own
target's `timeout`."""

from __future__ import annotations

import asyncio
import os
import re
import time

from exporter import cli
from exporter.collector import Collector
from exporter.config import ExporterConfig, TargetConfig
from exporter.cycle import PageCycle
from exporter.exposition import render
from exporter.sources.file import SavedPages

# Self-metrics that read a clock or the process: they differ between any two runs.
_TIMED = re.compile(r"^(llm_\S*(_duration_|_last_collection_)|process_)")


def _comparable(page: bytes) -> str:
    return "\n".join(line for line in page.decode().splitlines() if not _TIMED.match(line))


def _targets(tmp_path, pages_dir) -> tuple[TargetConfig, ...]:
    cut = tmp_path / "cut.prom"
    cut.write_bytes((pages_dir / "sglang.prom").read_bytes().rstrip(b"\n"))  # no final line feed: truncated
    foreign = tmp_path / "foreign.prom"
    foreign.write_text("# TYPE something_else gauge\nsomething_else 1\n")
    return (
        TargetConfig(kind="vllm", url=f"file://{pages_dir / 'vllm-v1.prom'}", name="vllm", model="m1"),
        TargetConfig(kind="auto", url=f"file://{pages_dir / 'tgi.prom'}", name="tgi"),
        TargetConfig(kind="sglang", url=f"file://{cut}", name="cut"),
        TargetConfig(kind="auto", url=f"file://{foreign}", name="foreign"),
        TargetConfig(kind="vllm", url=f"file://{tmp_path / 'missing.prom'}", name="missing"),
        TargetConfig(kind="vllm", url=f"file://{pages_dir / 'vllm-v1.prom'}", name="again", model="m1"),
    )


def test_the_loop_free_cycle_makes_the_loop_cycles_snapshot(tmp_path, pages_dir):
    targets = _targets(tmp_path, pages_dir)
    config = ExporterConfig(targets=targets, gpu="off")
    assert cli.loop_free(config)
    loop_free = PageCycle(config, "n").collect_files(targets)

    async def on_the_loop():
        collector = Collector(config, None, None, "n")
        try:
            return await collector.collect(targets)
        finally:
            await collector.close()

    on_loop = asyncio.run(on_the_loop())
    reasons = {t.target: t.reason for t in loop_free.targets}
    assert reasons == {t.target: t.reason for t in on_loop.targets}
    assert reasons == {"vllm": "", "tgi": "", "cut": "truncated", "foreign": "unknown_engine",
                       "missing": "not_found", "again": ""}
    assert [(t.engine, t.series) for t in loop_free.targets] == [(t.engine, t.series) for t in on_loop.targets]
    assert _comparable(render(loop_free.samples)) == _comparable(render(on_loop.samples))


def test_only_saved_pages_without_gpus_or_discovery_go_without_the_loop():
    page = (TargetConfig(kind="vllm", url="file:///p.prom"),)
    assert cli.loop_free(ExporterConfig(targets=page, gpu="off"))
    assert not cli.loop_free(ExporterConfig(targets=page, gpu="fake:1"))
    assert not cli.loop_free(ExporterConfig(targets=(*page, TargetConfig(kind="vllm", url="http://e:8000/metrics")),
                                            gpu="off"))


def _unblock(fifo) -> None:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader waiting any more
        pass


def test_a_hung_file_is_its_own_targets_timeout_and_the_pages_after_it_are_still_read(tmp_path, pages_dir):
    fifo = tmp_path / "hung.fifo"
    os.mkfifo(fifo)  # opening it for reading blocks until a writer appears: a read that never returns
    page = f"file://{pages_dir / 'vllm-v1.prom'}"
    targets = (TargetConfig(kind="vllm", url=page, name="before"),
               TargetConfig(kind="vllm", url=f"file://{fifo}", name="fifo", timeout_s=0.3),
               TargetConfig(kind="vllm", url=page, name="after", model="m2"),
               TargetConfig(kind="vllm", url=page, name="last", model="m3", timeout_s=0.3))
    config = ExporterConfig(targets=targets, gpu="off")
    started = time.monotonic()
    try:
        snap = PageCycle(config, "n").collect_files(targets)
    finally:
        _unblock(fifo)
    took = time.monotonic() - started
    assert {t.target: t.reason for t in snap.targets} == {"before": "", "fifo": "timeout", "after": "", "last": ""}
    assert 0.3 <= took < 2.0  # the FIFO's deadline, and each page after it timed afresh: none waited on the FIFO
    assert [t.series > 0 for t in snap.targets] == [True, False, True, True]


def test_saved_pages_keep_no_page_once_handed_over(tmp_path):
    path = tmp_path / "p.prom"
    path.write_bytes(b"a 1\n")
    pages = SavedPages([(f"file://{path}", 100), (f"file://{tmp_path / 'none'}", 100)])
    body, read = pages.result(0, time.perf_counter(), 5.0)
    assert body == b"a 1\n" and read > 0
    assert pages._done[0] == (None, None, read)  # the caller holds the only reference
    try:
        pages.result(1, time.perf_counter(), 5.0)
    except Exception as exc:  # the read's own error, raised in the caller's thread
        assert getattr(exc, "reason", None) == "not_found"
    else:
        raise AssertionError("a missing file read as a page")


def test_a_regular_file_read_at_its_size_still_gets_what_it_grew_by_up_to_the_bound(tmp_path, monkeypatch):
    from exporter.sources import file as file_source

    path = tmp_path / "growing.prom"
    path.write_bytes(b"a 1\n" * 100)  # 400 bytes, but fstat will say 40: the file grew after the stat
    real_fstat = os.fstat

    def stale_fstat(fd):
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, *tuple(st)[1:6], 40, *tuple(st)[7:]))

    monkeypatch.setattr(file_source.os, "fstat", stale_fstat)
    assert file_source._read_bounded(str(path), 400) == b"a 1\n" * 100
    try:
        file_source._read_bounded(str(path), 399)
    except Exception as exc:
        assert getattr(exc, "reason", None) == "page_too_large"
    else:
        raise AssertionError("a file past the bound was read")
