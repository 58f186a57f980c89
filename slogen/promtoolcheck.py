"""promtool on generated rules: `slogen build` checks every rule file before writing it, `slogen validate
--promtool` each SLO's rules. Without promtool on PATH the build says so and checks nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from slogen.errors import SpecError
from slogen.writers import rule_file

RULE_FILE_SUFFIX = ".rules.yaml"


def check_files(artifacts: Mapping[str, str | Path]) -> list[tuple[str, str]]:
    """`promtool check rules` on the generated rule files (`*.rules.yaml`), before anything is written: the
    (path, promtool's message) of each it rejects. Without promtool on PATH it says so and checks nothing."""
    rule_paths = sorted(p for p in artifacts if p.endswith(RULE_FILE_SUFFIX))
    if not rule_paths:
        return []
    promtool = shutil.which("promtool")
    if promtool is None:
        print("note: promtool is not on PATH: the generated rule files were not checked with `promtool check rules` "
              "(install Debian's prometheus package to check them)", file=sys.stderr)
        return []
    rejected = []
    with tempfile.TemporaryDirectory(prefix="slogen-check-") as tmp:
        staged = []
        for i, rel in enumerate(rule_paths):
            content = artifacts[rel]
            if isinstance(content, Path):  # already a file (slogen.build.build_into)
                staged.append((rel, content))
                continue
            path = Path(tmp) / f"{i}{RULE_FILE_SUFFIX}"
            path.write_text(content)
            staged.append((rel, path))
        # one promtool for all files (fast); only when it fails, one per file to name each file's own message
        proc = subprocess.run([promtool, "check", "rules", *(str(p) for _, p in staged)], capture_output=True, text=True)
        if proc.returncode == 0:
            return []
        for rel, path in staged:
            one = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
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
