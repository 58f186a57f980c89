"""Which rule files' exact bytes one promtool binary has already accepted: `slogen build` checks only the others.

Why: `promtool check rules` is a third of a large build's CPU (1,000 SLOs: about 4.5 s on 102 files), and most
rebuilds change few rule files. The check is a pure function of the file's bytes and the promtool binary, so a
file whose SHA-256 that binary accepted before needs no second parse. Only accepted files are remembered (a
rejected file is checked again every build), and a first build, or one with another promtool, checks every file.

Layout: `<cache>/promtool-check/<binary key>/<sha256 of the file>`, an empty file per accepted text. The binary
key is a hash of promtool's resolved path, size, modification time and inode: installing another version
changes it (no `promtool --version` process in the build's path). The cache directory is `$SLOGEN_CACHE_DIR`,
else `$XDG_CACHE_HOME/slogen`, else `~/.cache/slogen`; `SLOGEN_CACHE_DIR=off` turns the cache off. It holds
only empty files and may be deleted at any time (the next build checks everything again).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

OFF = "off"


def cache_root(env: os._Environ[str] | dict[str, str] = os.environ) -> Path | None:
    """The cache directory the environment names; None when it turns the cache off."""
    named = env.get("SLOGEN_CACHE_DIR")
    if named is not None:
        return None if named in ("", OFF) else Path(named)
    xdg = env.get("XDG_CACHE_HOME")
    return Path(xdg) / "slogen" if xdg else Path.home() / ".cache" / "slogen"


def binary_key(promtool: str) -> str:
    """A short hash naming one installed promtool binary (path, size, mtime, inode)."""
    real = os.path.realpath(promtool)
    st = os.stat(real)
    return hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}".encode()).hexdigest()[:24]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class AcceptedTexts:
    """The accepted-file hashes of one promtool binary. Every failure to read or write the cache (a read-only
    home, a full disk) only means the file is checked again: `known` says False, `remember` does nothing."""

    def __init__(self, root: Path, promtool: str) -> None:
        self.dir = root / "promtool-check" / binary_key(promtool)

    @classmethod
    def for_promtool(cls, promtool: str | None) -> AcceptedTexts | None:
        """The cache for this promtool as the environment places it; None without promtool or with the cache off."""
        root = cache_root()
        if promtool is None or root is None:
            return None
        try:
            return cls(root, promtool)
        except OSError:
            return None

    def known(self, sha: str) -> bool:
        return os.path.exists(self.dir / sha)

    def remember(self, shas: Iterable[str]) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for sha in shas:
                (self.dir / sha).touch()
        except OSError:
            pass
