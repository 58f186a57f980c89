"""`slogen build` replaces its output tree as a whole (slogen/outtree.py): a failed build leaves
the previous outputs byte-identical, and a crash leaves each output directory old or new."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slogen import outtree
from slogen.cli import main

REPO = Path(__file__).resolve().parents[2]
HAND_WRITTEN = {"alerts/README.md": "kept by hand\n", "deploy/generated/notes/keep.txt": "also kept\n"}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    shutil.copytree(REPO / "slos", tmp_path / "slos")
    monkeypatch.chdir(tmp_path)
    assert main(["build"]) == 0
    for rel, text in HAND_WRITTEN.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root but the inputs, hidden ones included (a leftover staging tree shows up)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.relative_to(root).as_posix().startswith("slos/")}


def leftovers(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if ".slogen-" in p.name]


def change_specs(root: Path) -> None:
    """An edit that changes files in several output directories (rules, tests, dashboards, runbooks)."""
    chat = root / "slos" / "chat.yaml"
    text = chat.read_text()
    assert "objective: 99.9" in text
    chat.write_text(text.replace("objective: 99.9", "objective: 99.5"))


def count_writes(root: Path, monkeypatch) -> int:
    """How many files a build after change_specs writes (on a scratch copy of the tree)."""
    scratch = root.parent / "scratch"
    shutil.copytree(root, scratch)
    calls = []
    real = outtree._write_file
    monkeypatch.setattr(outtree, "_write_file", lambda p, t: (calls.append(p), real(p, t)))
    monkeypatch.chdir(scratch)
    change_specs(scratch)
    assert main(["build"]) == 0
    monkeypatch.undo()
    monkeypatch.chdir(root)
    shutil.rmtree(scratch)
    return len(calls)


def failing_call(real: Callable[..., Any], nth: int, code: int) -> tuple[Callable[..., Any], list[tuple]]:
    """`real`, except that its `nth` call raises OSError(`code`) naming its first argument, as a full disk or a
    failing device would; with the list of every call's arguments."""
    calls: list[tuple] = []

    def stand_in(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == nth:
            raise OSError(code, os.strerror(code), str(args[0]))
        return real(*args)

    return stand_in, calls


@pytest.mark.parametrize("nth", ["first", "middle", "last"])
def test_a_failed_write_mid_build_leaves_every_output_byte_identical(workdir, monkeypatch, capsys, nth):
    total = count_writes(workdir, monkeypatch)
    assert total >= 5, total  # rules, tests, PrometheusRule, dashboard, the tap's copy of the spec
    fail_at = {"first": 1, "middle": total // 2, "last": total}[nth]
    before = snapshot(workdir)
    change_specs(workdir)
    real = outtree._write_file
    flaky, calls = failing_call(real, fail_at, errno.ENOSPC)
    monkeypatch.setattr(outtree, "_write_file", flaky)
    assert main(["build"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "the previous outputs are as they were" in err
    assert len(calls) == fail_at
    assert snapshot(workdir) == before and not leftovers(workdir)
    assert main(["build", "--check"]) == 1  # the outputs are the old ones: stale against the edited spec
    monkeypatch.setattr(outtree, "_write_file", real)
    assert main(["build"]) == 0 and main(["build", "--check"]) == 0
    after = snapshot(workdir)
    assert after != before and not leftovers(workdir)
    assert {rel: after[rel].decode() for rel in HAND_WRITTEN} == HAND_WRITTEN  # hand-written files are carried over


def test_a_failed_swap_puts_back_the_directories_already_swapped(workdir, monkeypatch, capsys):
    before = snapshot(workdir)
    change_specs(workdir)
    second_fails, _ = failing_call(outtree._exchange, 2, errno.EIO)
    monkeypatch.setattr(outtree, "_exchange", second_fails)
    assert main(["build"]) == 1
    assert snapshot(workdir) == before and not leftovers(workdir)


def test_without_rename_exchange_the_two_rename_fallback_gives_the_same_tree(workdir, monkeypatch, tmp_path):
    change_specs(workdir)
    monkeypatch.setattr(outtree, "_exchange", lambda a, b: False)
    assert main(["build"]) == 0 and not leftovers(workdir)
    with_fallback = snapshot(workdir)
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert main(["build", "--out", "fresh"]) == 0
    fresh = {k.removeprefix("fresh/"): v for k, v in snapshot(workdir).items() if k.startswith("fresh/")}
    assert {k: v for k, v in with_fallback.items() if not k.startswith("fresh/") and k not in HAND_WRITTEN} == fresh


def test_unchanged_outputs_are_not_rewritten(workdir):
    rules = workdir / "alerts" / "batch.rules.yaml"
    inode, root_inode = rules.stat().st_ino, (workdir / "dashboards").stat().st_ino
    assert main(["build"]) == 0  # nothing changes: no directory is swapped
    assert (workdir / "dashboards").stat().st_ino == root_inode and rules.stat().st_ino == inode
    change_specs(workdir)  # chat changes; batch's files are carried into the new alerts/ as hard links
    assert main(["build"]) == 0
    assert rules.stat().st_ino == inode and (workdir / "dashboards").stat().st_ino != root_inode


CRASH = """
import os, sys
from slogen import outtree
from slogen.cli import main
mode = sys.argv[1]
if mode == "between-renames":  # the fallback: root -> old, then (crash) staged -> root
    outtree._exchange = lambda a, b: False
    real_rename, seen = os.rename, []
    def rename(a, b):
        seen.append(b)
        if len(seen) == 2:
            os._exit(9)
        real_rename(a, b)
    os.rename = rename
else:  # between the exchanges of two directories
    real_exchange, seen = outtree._exchange, []
    def exchange(a, b):
        seen.append(b)
        if len(seen) == 2:
            os._exit(9)
        return real_exchange(a, b)
    outtree._exchange = exchange
sys.exit(main(["build"]))
"""


def _crash(workdir: Path, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", CRASH, mode], cwd=workdir, env=env, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr


def test_a_crash_between_the_two_renames_of_the_fallback_is_undone_by_the_next_build(workdir, capsys):
    before = snapshot(workdir)
    change_specs(workdir)
    _crash(workdir, "between-renames")
    assert not (workdir / "alerts").exists()  # the first root was moved aside and the process died
    beside = sorted(p.name.split(".")[2] for p in workdir.iterdir() if p.name.startswith(".alerts."))
    assert beside == ["slogen-new", "slogen-old"]  # the complete new copy, and the old one moved aside
    assert main(["build", "--check"]) == 1 and "alerts/chat.rules.yaml: missing" in capsys.readouterr().err
    restored = outtree.recover(workdir, ["alerts", "dashboards", "slogen/kustomize/examples/inference", "deploy/generated",
                                         "docs/runbooks"])
    assert restored == ["alerts"] and snapshot(workdir) == before and not leftovers(workdir)
    assert main(["build"]) == 0 and main(["build", "--check"]) == 0 and not leftovers(workdir)


def test_a_crash_between_two_directory_swaps_leaves_each_directory_old_or_new(workdir):
    before = snapshot(workdir)
    change_specs(workdir)
    assert main(["build", "--out", "expected"]) == 0
    new = {k.removeprefix("expected/"): v for k, v in snapshot(workdir).items() if k.startswith("expected/")}
    shutil.rmtree(workdir / "expected")
    _crash(workdir, "between-swaps")
    now = snapshot(workdir)
    old_or_new = {}
    for root in ("alerts", "dashboards", "docs/runbooks", "deploy/generated"):
        mine = {k: v for k, v in now.items() if k.startswith(root + "/") and k not in HAND_WRITTEN}
        if mine == {k: v for k, v in new.items() if k.startswith(root + "/")}:
            old_or_new[root] = "new"
        elif mine == {k: v for k, v in before.items() if k.startswith(root + "/") and k not in HAND_WRITTEN}:
            old_or_new[root] = "old"
    assert old_or_new == {"alerts": "new", "dashboards": "old", "docs/runbooks": "old", "deploy/generated": "old"}
    assert leftovers(workdir)  # the dead build's old alerts/ is still beside it
    assert main(["build"]) == 0 and main(["build", "--check"]) == 0 and not leftovers(workdir)


def test_an_output_directory_that_is_a_symlink_stays_one(tmp_path, monkeypatch):
    shutil.copytree(REPO / "slos", tmp_path / "slos")
    (tmp_path / "elsewhere" / "alerts").mkdir(parents=True)
    (tmp_path / "elsewhere" / "alerts" / "README.md").write_text("hand\n")
    (tmp_path / "alerts").symlink_to(tmp_path / "elsewhere" / "alerts")
    monkeypatch.chdir(tmp_path)
    assert main(["build"]) == 0
    rules = (tmp_path / "alerts" / "chat.rules.yaml").read_text()
    change_specs(tmp_path)
    assert main(["build"]) == 0 and main(["build", "--check"]) == 0
    assert (tmp_path / "alerts").is_symlink() and (tmp_path / "alerts" / "README.md").read_text() == "hand\n"
    assert (tmp_path / "elsewhere" / "alerts" / "chat.rules.yaml").read_text() != rules
    assert not leftovers(tmp_path) and not leftovers(tmp_path / "elsewhere")
