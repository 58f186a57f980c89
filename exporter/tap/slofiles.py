"""Reading the tap's SLO files without trusting what their paths point at.

Why: the tap relays every stream of its pod, so a reload must never block it, starve it of memory or kill
it. A path may be swapped for a FIFO (an open() that blocks until a writer comes, and a reader thread that
then keeps the process from exiting) or a device (`/dev/zero` reads for ever), and a file that fits in a
ConfigMap (1 MiB) can hold half a million tiny YAML nodes, several hundred MiB once composed. So a file
is opened without blocking and checked with fstat before a byte is read (a regular file, or at start a
pipe, read once: `--slo <(...)`), read up to a byte limit, and its YAML nodes are counted on the parser's
event stream, which holds one event at a time, before anything is composed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

import yaml
from yaml.events import AliasEvent, MappingStartEvent, ScalarEvent, SequenceStartEvent

MAX_FILE_BYTES = 1 << 20  # a ConfigMap holds at most 1 MiB
MAX_TOTAL_BYTES = 4 << 20  # all the files of one --slo set together
# YAML nodes (scalars, mappings, lists, aliases) over all the files: composed, each costs up to ~1 KiB,
# so this holds a reload's parse to ~100 MiB. A real SLO takes 30-60 nodes: 100,000 is over 1,500 SLOs.
MAX_NODES = 100_000
_NODE_EVENTS = (ScalarEvent, MappingStartEvent, SequenceStartEvent, AliasEvent)
_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SloSourceError(ValueError):
    """An SLO path the tap refuses to read; `reason` is a short word for the log line."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def is_pipe(path: str | Path) -> bool:
    """Whether `path` names a pipe (`--slo <(...)`, a FIFO): stat, which never blocks on one."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def one_shot_sources(paths: Iterable[str | Path]) -> list[str]:
    """The paths that are pipes: a pipe's contents can be read once only, so they are never reloaded."""
    return [str(p) for p in paths if is_pipe(p)]


def _read_fd(fd: int, path: Path, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        part = os.read(fd, min(1 << 16, limit + 1 - size))
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
        if size > limit:
            raise SloSourceError(f"{path}: larger than {limit} bytes, more than the tap reads (fix: split the SLOs "
                                 f"over files of at most {MAX_FILE_BYTES} bytes, {MAX_TOTAL_BYTES} in all)", "too_large")


def read_source(path: Path, limit: int = MAX_FILE_BYTES, pipe_ok: bool = False) -> bytes:
    """The bytes of one SLO file, at most `limit`: a regular file, or a pipe when `pipe_ok` (at start).

    Opened with O_NONBLOCK and checked with fstat before reading, so a FIFO or a device swapped in for the
    file is refused without blocking; OSError when it cannot be opened."""
    if pipe_ok and is_pipe(path):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # at start: wait for the pipe's writer, read it once
    else:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            fix = "give a regular file or a directory of them"
            if stat.S_ISFIFO(mode):
                fix += "; a pipe is read once, at start (`--slo <(...)`), and not reloaded"
            raise SloSourceError(f"{path}: {_kind(mode)}, not a regular file; the tap does not read it (fix: {fix})",
                                 "not_regular")
    try:
        return _read_fd(fd, path, limit)
    finally:
        os.close(fd)


def read_sources(paths: Iterable[Path], pipe_ok: bool = False) -> list[tuple[Path, bytes]]:
    """Every file's bytes, within MAX_FILE_BYTES each and MAX_TOTAL_BYTES in all."""
    out: list[tuple[Path, bytes]] = []
    left = MAX_TOTAL_BYTES
    for path in paths:
        data = read_source(path, min(MAX_FILE_BYTES, left), pipe_ok)
        left -= len(data)
        out.append((path, data))
    return out


def check_directory(directory: Path) -> None:
    """SloSourceError for a *.yaml / *.yml entry below `directory` that is neither a file nor a directory (a
    FIFO, a device, a link to one), which directory discovery would skip without a word, dropping its SLOs;
    hidden entries (a ConfigMap's `..data` copies) are not looked at."""
    for x in sorted(directory.rglob("*")):
        if x.suffix in (".yaml", ".yml") and not x.is_dir() and not x.is_file() and not any(
                part.startswith(".") for part in x.relative_to(directory).parts):
            try:
                kind = _kind(os.stat(x).st_mode)
            except OSError as e:
                kind = f"unreadable ({e.strerror})"
            raise SloSourceError(f"{x}: {kind}, not a regular file; the tap does not read it (fix: give a regular "
                                 "file)", "not_regular")


def count_nodes(text: str, file: str, budget: int) -> int:
    """The YAML nodes of `text`, counted on the parser's event stream (constant memory); SloSourceError once
    they pass `budget`. A text that does not parse is counted up to its error (the loader words that)."""
    n = 0
    try:
        for ev in yaml.parse(text, Loader=_PARSER):
            if isinstance(ev, _NODE_EVENTS):
                n += 1
                if n > budget:
                    raise SloSourceError(
                        f"{file}: more than {MAX_NODES} YAML nodes in the SLO files, more than the tap composes "
                        "(fix: SLO files hold SLOs, 30-60 nodes each; remove what is not an SLO)", "too_many_nodes")
    except yaml.YAMLError:
        pass
    return n
