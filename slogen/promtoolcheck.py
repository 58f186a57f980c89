"""promtool on generated rules: `slogen build` checks every rule file before writing it, `slogen validate
--promtool` each SLO's rules. Without promtool on PATH the build says so and checks nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from slogen.checkcache import AcceptedTexts, digest
from slogen.errors import SpecError
from slogen.writers import rule_file

RULE_FILE_SUFFIX = ".rules.yaml"
# Go's collector less often (GOGC 400, unless the environment sets it): promtool's parse of 1,000 SLOs' rules
# takes 3.6 s of CPU instead of 4.6 (80 MB of memory instead of 50; GOGC=off held 1.8 GB).
GOGC = "400"


class RuleFilesCheck:
    """`promtool check rules` on generated rule files (`*.rules.yaml`), started as they are made: `add` gives it
    one step's files (path -> text, or the file already written) and starts one promtool on their rule files in
    the background; `rejected` waits for every one. A build's check (5 s of promtool at 1,000 SLOs) so runs
    while the build makes its other files. Use it as a context manager: leaving stops what still runs.
    A file whose exact bytes this promtool accepted before (slogen.checkcache; `cache=False` ignores it) is not
    checked again; the files of each promtool that passes are remembered once every run is waited for."""

    def __init__(self, cache: bool = True) -> None:
        self.promtool = shutil.which("promtool")
        self.cache = AcceptedTexts.for_promtool(self.promtool) if cache else None
        self.tmp = tempfile.TemporaryDirectory(prefix="slogen-check-")
        self.staged: list[tuple[str, Path]] = []
        self.running: list[subprocess.Popen] = []
        self.hashes: list[list[str]] = []  # per running promtool: its files' SHA-256, remembered if it passes
        self.cached = 0  # files not checked again: accepted before

    def __enter__(self) -> RuleFilesCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.running:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.running = []
        self.tmp.cleanup()

    def add(self, artifacts: Mapping[str, str | Path]) -> None:
        staged, hashes = [], []
        for rel in sorted(p for p in artifacts if p.endswith(RULE_FILE_SUFFIX)):
            content = artifacts[rel]
            if self.cache is not None:
                sha = digest(content.read_bytes() if isinstance(content, Path) else content.encode())
                if self.cache.known(sha):
                    self.cached += 1
                    continue
                hashes.append(sha)
            if isinstance(content, Path):  # already a file (slogen.build.build_into)
                staged.append((rel, content))
                continue
            path = Path(self.tmp.name) / f"{len(self.staged) + len(staged)}{RULE_FILE_SUFFIX}"
            path.write_text(content)
            staged.append((rel, path))
        self.staged += staged
        if staged and self.promtool is not None:  # one promtool for a step's files (fast)
            self.running.append(subprocess.Popen([self.promtool, "check", "rules", *(str(p) for _, p in staged)],
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                 env={"GOGC": GOGC, **os.environ}))
            self.hashes.append(hashes)

    def rejected(self) -> list[tuple[str, str]]:
        """The (path, promtool's message) of each rule file it rejects; without promtool on PATH it says so
        and checks nothing."""
        if not self.staged:
            return []
        if self.promtool is None:
            print("note: promtool is not on PATH: the generated rule files were not checked with `promtool check "
                  "rules` (install Debian's prometheus package to check them)", file=sys.stderr)
            return []
        failed = [proc.wait() != 0 for proc in self.running]
        if self.cache is not None:
            self.cache.remember(sha for bad, shas in zip(failed, self.hashes, strict=True) for sha in shas if not bad)
        if not any(failed):
            return []
        rejected = []
        for rel, path in sorted(self.staged):  # only when one failed: one promtool per file, to name each file's message
            one = subprocess.run([self.promtool, "check", "rules", str(path)], capture_output=True, text=True)
            if one.returncode:
                text = (one.stderr + one.stdout).replace(str(path), rel)
                lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Checking ")]
                lines = [t for t in (ln.removeprefix("FAILED:").strip() for ln in lines) if t]
                more = f" ... and {len(lines) - 3} more" if len(lines) > 3 else ""
                rejected.append((rel, "; ".join(lines[:3]) + more or f"exit status {one.returncode}"))
        return rejected


def check_results(results) -> list[SpecError]:
    """Full PromQL parsing of every generated rule, by promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return [SpecError("promtool", "promtool is not installed", fix="install Debian's prometheus package or drop --promtool")]
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in results:
            path = Path(tmp) / f"{r.slo.id}.yaml"
            path.write_text(rule_file(r.rules.groups()))
            proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
            if proc.returncode:
                detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                errors.append(SpecError(r.slo.origin.file, f"generated rules do not parse: {' '.join(detail)}",
                                        r.slo.origin.path, r.slo.id, "check the SLI queries", r.slo.origin.line))
    return errors
