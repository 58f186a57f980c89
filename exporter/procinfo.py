"""The exporter's own identity and process: `llmslo_build_info` and the standard `process_*` series.

The process series carry the names and meanings of prometheus_client's ProcessCollector (every
Prometheus client library writes them alike), read from /proc here: importing prometheus_client
costs the exporter's start-up about 60 ms for six numbers. They are read once per cycle, like every
other series, so they are as old as the snapshot. Where /proc is missing (not Linux) only
`process_start_time_seconds` and `process_cpu_seconds_total` remain, from the standard library.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from exporter.model import NormSample
from llmslo import conventions as c
from llmslo.version import version

_PROC = "/proc/self"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = resource.getpagesize()
_STARTED_AT = time.time()  # the fallback start time: this module is imported at start-up


# platform.python_implementation()'s names, from sys: `platform` costs `--once` a millisecond to import
_IMPLEMENTATIONS = {"cpython": "CPython", "pypy": "PyPy", "ironpython": "IronPython", "jython": "Jython"}


def build_info() -> dict[str, str]:
    """The labels of llmslo_build_info; also what `--version` prints. The same values as platform's
    python_version() and python_implementation() (sys.version's first word: 3.12.1, 3.13.0rc1)."""
    return {
        c.LABEL_VERSION: version(),
        c.LABEL_PYTHON_VERSION: sys.version.split()[0],
        c.LABEL_PYTHON_IMPLEMENTATION: _IMPLEMENTATIONS.get(sys.implementation.name, sys.implementation.name),
    }


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


_BOOT_TIME = _boot_time()


def _stat_fields() -> list[bytes] | None:
    """/proc/self/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"{_PROC}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def _max_fds() -> float | None:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else float(soft)


def process_samples() -> list[NormSample]:
    """The process_* series now; any that cannot be read is left out, never reported as 0."""
    out: list[NormSample] = []
    fields = _stat_fields()
    if fields is not None:
        # Counting from field 3 (state) of proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24.
        utime, stime, start_ticks, vsize, rss = (float(fields[i]) for i in (11, 12, 19, 20, 21))
        out.append(NormSample(c.PROCESS_CPU, {}, (utime + stime) / _TICKS))
        out.append(NormSample(c.PROCESS_VIRTUAL_MEMORY, {}, vsize))
        out.append(NormSample(c.PROCESS_RESIDENT_MEMORY, {}, rss * _PAGE))
        start = _BOOT_TIME + start_ticks / _TICKS if _BOOT_TIME is not None else _STARTED_AT
        out.append(NormSample(c.PROCESS_START_TIME, {}, start))
        try:
            out.append(NormSample(c.PROCESS_OPEN_FDS, {}, float(len(os.listdir(f"{_PROC}/fd")))))
        except OSError:
            pass
    else:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out.append(NormSample(c.PROCESS_CPU, {}, usage.ru_utime + usage.ru_stime))
        out.append(NormSample(c.PROCESS_START_TIME, {}, _STARTED_AT))
    max_fds = _max_fds()
    if max_fds is not None and fields is not None:
        out.append(NormSample(c.PROCESS_MAX_FDS, {}, max_fds))
    return out


def self_samples() -> list[NormSample]:
    """llmslo_build_info and the process series: what every Prometheus exporter's page carries."""
    return [NormSample(c.BUILD_INFO, build_info(), 1.0), *process_samples()]
