"""Replace `slogen build`'s output directories whole: build beside, then swap.

The outputs live in a few directories under `--out` (alerts/, dashboards/, docs/runbooks/,
deploy/generated/, ...): the *roots*, the top-most directories that hold generated files. A
build that changes anything in a root writes a complete new copy of it next to it, in
`<parent>/.<name>.slogen-new.<pid>.<random>`: the files this build generates (an unchanged one
is hard-linked, so it is not rewritten), plus everything else already in the root (hand-written
files, hard-linked or copied), less the orphans being removed. Only when every root is staged
does the swap begin; then each root is exchanged with its staged copy in one `renameat2(...,
RENAME_EXCHANGE)` call, and the old copies are deleted.

Guarantees:

* A failure before the swap (a write error, a full disk, an exception in any file) leaves every
  output exactly as it was: nothing under the roots is touched until all of them are staged.
* An error during the swap (a rename refused) swaps back the roots already exchanged.
* Each root is at every instant either entirely old or entirely new, also across a crash or a
  kill: the exchange is one system call. Roots are swapped one after another, so a crash in the
  middle of the swap can leave some roots new and others old (each one consistent); the next
  `slogen build` completes it, and `slogen build --check` reports what differs.
* Where the kernel or the file system cannot exchange (not Linux, or a file system without
  RENAME_EXCHANGE), a root is replaced by two renames (root -> `.<name>.slogen-old.*`, staged ->
  root). A crash between the two leaves the root absent and its old copy beside it; the next
  build puts the old copy back before it does anything else.
* Leftovers of a build that died (its pid is gone) are removed by the next build.

Files directly under `--out` itself (no root directory) are replaced one at a time, atomically
each (`llmslo.files.write_atomic`). `slogen build` generates none today.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import filecmp
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmslo.files import write_atomic

NEW = "slogen-new"
OLD = "slogen-old"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def roots_of(dirs: set[str] | list[str]) -> list[str]:
    """The top-most of `dirs` (relative POSIX paths): those without an ancestor among them; "." is not a root."""
    clean = {Path(d).as_posix() for d in dirs} - {".", ""}
    return sorted(d for d in clean if not any(d.startswith(other + "/") for other in clean))


def _root_of(rel: str, roots: list[str]) -> str | None:
    return next((r for r in roots if rel.startswith(r + "/")), None)


# ----------------------------------------------------------------------------- system calls


def _load_renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _load_renameat2()
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False when this system cannot (the caller falls back)."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


# What a generated file holds: its text, or the scratch file a large build wrote it to (`slogen.build.build_into`).
Content = str | Path


def _write_file(path: Path, content: Content) -> None:
    """One new file in the staged tree (tests replace this to inject a failed write): the text written, or the
    scratch file linked in (copied across file systems). Made durable with the rest of the stage by one
    `_sync_staged` before any swap: an fsync per file cost 1 ms each, 3 s of a 3,000-file build."""
    if isinstance(content, Path):
        try:
            os.link(content, path)
        except OSError:
            shutil.copyfile(content, path)
    else:
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(content)
    os.chmod(path, 0o644)


def same_content(path: Path, content: Content) -> bool:
    """Whether the file at `path` holds exactly `content` (False when it cannot be read)."""
    if isinstance(content, Path):
        try:
            return filecmp.cmp(path, content, shallow=False)
        except OSError:
            return False
    return _current(path) == content


def text_of(content: Content) -> str:
    return content.read_text(encoding="utf-8") if isinstance(content, Path) else content


def _load_syncfs():
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int,)
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = _load_syncfs()


def _sync_staged(paths: list[Path]) -> None:
    """Flush every staged file to disk before the swaps, once per file system (syncfs; os.sync elsewhere)."""
    devices: set[int] = set()
    for path in paths:
        dev = os.stat(path).st_dev
        if dev in devices:
            continue
        devices.add(dev)
        fd = os.open(path, os.O_RDONLY)
        try:
            if _SYNCFS is None or _SYNCFS(fd) != 0:
                os.sync()
        finally:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _carry(src: Path, dst: Path) -> None:
    """An existing file into the staged tree, unchanged: a hard link where possible, else a copy."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


# ------------------------------------------------------------------------- leftovers


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers(root: Path) -> list[tuple[Path, str]]:
    """(path, NEW or OLD) for the staged or old copies of `root` that a dead build left beside it."""
    out: list[tuple[Path, str]] = []
    parent = root.parent
    if not parent.is_dir():
        return out
    prefix = f".{root.name}."
    for entry in parent.iterdir():
        name = entry.name
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix):].split(".")
        if len(parts) != 3 or parts[0] not in (NEW, OLD) or not parts[1].isdigit():
            continue
        if not _pid_alive(int(parts[1])):
            out.append((entry, parts[0]))
    return sorted(out)


def recover(out: Path, roots: list[str]) -> list[str]:
    """Undo what a build that died mid-swap left: put an old root back where the root is missing, then
    delete the dead build's staged and old copies and its scratch files. Returns the roots put back."""
    if out.is_dir():
        _remove_dead_scratch(out)
    restored = []
    for rel in roots:
        root = out / rel
        if root.is_symlink():
            root = root.resolve()
        found = _leftovers(root)
        if not root.exists():
            old = next((p for p, kind in found if kind == OLD), None)
            if old is not None:
                os.rename(old, root)
                restored.append(rel)
                found = [(p, k) for p, k in found if p != old]
        for path, _ in found:
            _remove(path)
    return restored


SCRATCH = "slogen-scratch"


def _remove_dead_scratch(base: Path) -> None:
    """The scratch directories of builds that died (their pid is gone) under `base`."""
    for entry in base.glob(f".{SCRATCH}.*"):
        pid = entry.name.split(".")[2]
        if pid.isdigit() and not _pid_alive(int(pid)):
            _remove(entry)


@contextlib.contextmanager
def scratch_dir(out: Path) -> Iterator[Path]:
    """A private directory under `out` (one file system with the outputs, so staging links rather than copies;
    not a tmpfs /tmp, which would hold a large build's text in memory after all) for a build to write its
    files to as it makes them; removed afterwards, and a dead build's is removed by the next. Until `out`
    exists, it is made under the nearest directory that does: a failed build creates nothing."""
    base = out.absolute()
    while not base.is_dir() and base != base.parent:
        base = base.parent
    _remove_dead_scratch(base)
    path = Path(tempfile.mkdtemp(prefix=f".{SCRATCH}.{os.getpid()}.", dir=base))
    try:
        yield path
    finally:
        _remove(path)


# ------------------------------------------------------------------------------ staging


@dataclass
class _Stage:
    rel: str
    root: Path
    staged: Path
    existed: bool
    old: Path | None = None  # where the old root went (after the swap)
    swapped: bool = False
    exchanged: bool = False
    keep: bool = False  # an undo failed: leave the copies for recover()
    changed: list[str] = field(default_factory=list)


def _current(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _prune_emptied(staged: Path, removed: list[Path]) -> None:
    """Remove the folders the removed files leave empty (a part of the install turned off), up to the root."""
    for path in removed:
        folder = (staged / path).parent
        while folder != staged and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def _stage(out: Path, rel: str, files: dict[str, Content], remove: set[str]) -> _Stage | None:
    """A complete new copy of root `rel` beside it; None when nothing in it changes."""
    root = out / rel
    if root.is_symlink():  # swap the directory it points at and keep the link
        root = root.resolve()
    changed = [p for p, content in files.items() if not same_content(out / p, content)]
    gone = sorted(p for p in remove if (out / p).exists())
    if not changed and not gone:
        return None
    root.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{root.name}.{NEW}.{os.getpid()}.", dir=root.parent))
    stage = _Stage(rel, root, staged, root.is_dir(), changed=changed)
    try:
        if stage.existed:
            os.chmod(staged, stat.S_IMODE(os.stat(root).st_mode))
            skip = set(files) | set(remove)
            for dirpath, dirnames, filenames in os.walk(root):
                here = Path(dirpath)
                for d in list(dirnames):
                    src = here / d
                    dst = staged / src.relative_to(root)
                    if src.is_symlink():  # carried as a link, not followed
                        os.symlink(os.readlink(src), dst)
                        dirnames.remove(d)
                        continue
                    os.mkdir(dst)
                    shutil.copymode(src, dst)
                for name in filenames:
                    src = here / name
                    if f"{rel}/{src.relative_to(root).as_posix()}" in skip:
                        continue
                    dst = staged / src.relative_to(root)
                    if src.is_symlink():
                        os.symlink(os.readlink(src), dst)
                    elif src.is_file():
                        _carry(src, dst)
                    else:
                        raise OSError(errno.EINVAL, f"cannot carry {src} (not a file) into the new output tree")
        else:
            os.chmod(staged, 0o755)
        unchanged = set(files) - set(changed)
        for p, content in files.items():
            dst = staged / Path(p).relative_to(rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if p in unchanged:
                _carry(out / p, dst)
            else:
                _write_file(dst, content)
        _prune_emptied(staged, [Path(p).relative_to(rel) for p in gone])
        return stage
    except BaseException:
        _remove(staged)
        raise


def _swap(stage: _Stage) -> None:
    if not stage.existed:
        os.rename(stage.staged, stage.root)  # fails if something appeared there meanwhile
        stage.swapped = True
        return
    if _exchange(stage.staged, stage.root):
        stage.old, stage.swapped, stage.exchanged = stage.staged, True, True
        return
    old = stage.staged.with_name(stage.staged.name.replace(f".{NEW}.", f".{OLD}.", 1))
    os.rename(stage.root, old)
    try:
        os.rename(stage.staged, stage.root)
    except BaseException:
        os.rename(old, stage.root)
        raise
    stage.old, stage.swapped = old, True


def _unswap(stage: _Stage) -> None:
    """Put the old root back after a later root's swap failed."""
    if not stage.swapped:
        return
    if not stage.existed:
        _remove(stage.root)
    elif stage.exchanged:
        _exchange(stage.staged, stage.root)
    else:
        assert stage.old is not None  # set with swapped
        os.rename(stage.root, stage.staged)
        os.rename(stage.old, stage.root)
    stage.swapped = False


def replace_tree(files: Mapping[str, Content], out: str | Path, dirs: set[str] | list[str],
                 remove: Sequence[str] = ()) -> list[str]:
    """Make the roots of `dirs` under `out` hold `files` (relative path -> content) and no longer `remove`,
    everything else in them kept; all roots are staged before any is swapped. Returns the changed paths."""
    out = Path(out)
    roots = roots_of(dirs)
    by_root: dict[str, dict[str, Content]] = {r: {} for r in roots}
    loose: dict[str, Content] = {}
    for p, text in files.items():
        r = _root_of(p, roots)
        (by_root[r] if r else loose)[p] = text
    gone_by_root: dict[str, set[str]] = {r: set() for r in roots}
    loose_gone = []
    for p in remove:
        r = _root_of(p, roots)
        (gone_by_root[r].add(p) if r else loose_gone.append(p))
    stages: list[_Stage] = []
    try:
        for r in roots:
            s = _stage(out, r, by_root[r], gone_by_root[r])
            if s is not None:
                stages.append(s)
        _sync_staged([s.staged for s in stages])
        done: list[_Stage] = []
        try:
            for s in stages:
                _swap(s)
                done.append(s)
        except BaseException:
            for s in reversed(done):
                try:
                    _unswap(s)
                except OSError:  # leave both copies where they are: the next build's recover() sorts them out
                    s.keep = True
            raise
    finally:
        for s in stages:
            if not s.keep:
                _remove(s.staged)
                if s.old is not None:
                    _remove(s.old)
    for parent in {s.root.parent for s in stages}:
        _fsync_dir(parent)
    changed = [p for s in stages for p in s.changed]
    changed += [p for p, content in loose.items() if write_atomic(out / p, text_of(content))]
    for p in loose_gone:
        (out / p).unlink(missing_ok=True)
    return sorted(changed)
