"""slogen build: layout, determinism, --check staleness, atomic writes, orphans, the chain hook."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from llmslo.files import write_atomic
from slogen import build as b
from slogen.cli import main
from slogen.outputs import stale_outputs
from slogen.steps import STEPS, Produced, Step

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    shutil.copytree(REPO / "slos", tmp_path / "slos")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and not p.relative_to(root).as_posix().startswith("slos/")}


def test_build_layout_and_byte_identical_runs(workdir):
    assert main(["build"]) == 0
    first = snapshot(workdir)
    assert set(first) >= {"alerts/chat.rules.yaml", "alerts/chat.test.yaml", "deploy/generated/prometheusrule-chat.yaml",
                          "alerts/batch.rules.yaml", "alerts/fleet.rules.yaml"}
    assert main(["build"]) == 0
    assert snapshot(workdir) == first
    # a fresh directory gives the same bytes too (nothing depends on time or on earlier state)
    assert main(["build", "--out", "again"]) == 0
    again = {k.removeprefix("again/"): v for k, v in snapshot(workdir).items() if k.startswith("again/")}
    assert again == first


def test_check_detects_stale_missing_and_orphaned_outputs(workdir, capsys):
    assert main(["build"]) == 0
    assert main(["build", "--check"]) == 0
    rules = workdir / "alerts" / "chat.rules.yaml"
    rules.write_text(rules.read_text().replace("0.001", "0.002"))
    assert main(["build", "--check"]) == 1
    assert "alerts/chat.rules.yaml: out of date" in capsys.readouterr().err
    assert main(["build"]) == 0 and main(["build", "--check"]) == 0
    (workdir / "slos" / "fleet.yaml").unlink()
    assert main(["build", "--check"]) == 1
    assert "alerts/fleet.rules.yaml: no longer generated" in capsys.readouterr().err
    assert main(["build"]) == 0
    assert not (workdir / "alerts" / "fleet.rules.yaml").exists()
    (workdir / "alerts" / "chat.test.yaml").unlink()
    assert main(["build", "--check"]) == 1


def test_committed_outputs_are_current():
    """CI guard: alerts/ and deploy/generated/ in the repository match a fresh `slogen build`."""
    from tests.artifacts.test_committed_outputs import repository_options

    artifacts = b.build(repository_options(inputs=(str(REPO / "slos"),))).files
    artifacts = {k: v.replace(str(REPO) + "/", "") for k, v in artifacts.items()}
    stale = stale_outputs(artifacts, REPO)
    assert not [s for s in stale if s.split(":")[0] in artifacts], stale


def test_atomic_write_leaves_old_file_intact_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "x.yaml"
    target.write_text("old\n")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.yaml"]  # no temp file left behind
    monkeypatch.undo()
    assert write_atomic(target, "new\n") is True and target.read_text() == "new\n"
    assert write_atomic(target, "new\n") is False  # unchanged content is not rewritten


def test_the_step_list_is_appendable(workdir):
    def count(catalog):
        return Produced({"dashboards/count.txt": f"{len(catalog.slos)}\n"}, ("counted",))

    built = b.build(b.BuildOptions(), [*STEPS, Step("count", count)])
    assert built.files["dashboards/count.txt"] == "10\n" and "alerts/chat.rules.yaml" in built.files
    assert built.notes[-1] == "counted"


def test_two_steps_making_one_path_is_an_error(workdir):
    twice = Step("twice", lambda catalog: Produced({"alerts/chat.rules.yaml": "x\n"}))
    with pytest.raises(b.SpecErrors, match="two build steps both produce alerts/chat.rules.yaml"):
        b.build(b.BuildOptions(), [*STEPS, twice])


def test_steps_read_a_frozen_catalog(workdir):
    """A step cannot leave anything in the catalog for a later one: what it makes is what it returns."""
    catalog = b.build(b.BuildOptions(), []).catalog
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog.slos = []  # type: ignore[misc]
    assert len(catalog.views) == len(catalog.results) and catalog.health_alerts and catalog.capacity_alerts


def test_override_period_uses_the_demo_catalog_it_is_given(workdir, capsys):
    """The demo's 1d catalog lives with the demo (demo/windows.yaml) and is passed as the demo passes it;
    without it, a 1d period has no catalog and the build is refused (once, not once per SLO)."""
    assert not (workdir / "slos" / "windows").exists()
    assert main(["build", "--out", "demo", "--override-period", "1d", "--no-autoscaling"]) == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--override-period 1d: the 1d period has no alert-window catalog" in err
    assert "catalogs loaded: 28d (built in), 30d (built in)" in err and "--windows demo/windows.yaml" in err
    assert not (workdir / "demo").exists()
    assert main(["build", "--out", "demo", "--windows", str(REPO / "demo" / "windows.yaml"), "--override-period", "1d",
                 "--no-autoscaling"]) == 0
    text = (workdir / "demo" / "alerts" / "chat.rules.yaml").read_text()
    assert "slo:sli_error:ratio_rate10s" in text and "vector(1)" in text and "ratio_rate30d" not in text


def test_a_parallel_build_makes_the_same_files_and_notes(tmp_path):
    """From PARALLEL_MIN_SLOS SLOs on, the forkable steps (the promtool tests, the dashboards) run in forked
    children: same bytes, and the notes (SLOs left without tests) in the same places as one process makes them."""
    from bench.bench_slogen import write_specs

    options = b.BuildOptions(inputs=(str(write_specs(tmp_path, 20)),))
    one = b.build(options, parallel=False)
    two = b.build(options, parallel=True)
    assert two.files == one.files and any(p.endswith(".test.yaml") for p in one.files)
    assert two.notes == one.notes and any("no generated tests" in n for n in one.notes)
    assert [s.name for s in STEPS if s.forkable] == ["tests", "dashboards"]


def test_a_build_written_as_it_goes_makes_the_same_files_and_notes(tmp_path):
    """`build_into` (what `slogen build` runs) writes each file to scratch as it is made, in one process and with
    the forked child: the same bytes and notes as the in-memory build, and no text kept in the result."""
    from bench.bench_slogen import write_specs

    options = b.BuildOptions(inputs=(str(write_specs(tmp_path, 20)),))
    memory = b.build(options, parallel=False)
    for parallel in (False, True):
        scratch = tmp_path / f"scratch-{parallel}"
        scratch.mkdir()
        streamed = b.build_into(options, scratch, parallel=parallel)
        assert list(streamed.files) == list(memory.files) and streamed.notes == memory.notes
        assert all(isinstance(f, Path) and f.is_relative_to(scratch) for f in streamed.files.values())
        assert {p: f.read_text() for p, f in streamed.files.items()} == memory.files


def test_a_parallel_build_raises_the_error_one_process_raises(workdir):
    """The child fails, the step runs again here and raises; its error comes first, as in the step list."""
    def tests_fail(catalog):
        raise b.SpecErrors([b.SpecError("alerts/chat.test.yaml", "tests broke", fix="-")])

    def later_fails(catalog):
        raise b.SpecErrors([b.SpecError("dashboards/x.json", "dashboards broke", fix="-")])

    rules = next(s for s in STEPS if s.name == "rules")
    for parallel in (False, True):
        with pytest.raises(b.SpecErrors, match="tests broke"):
            b.build(b.BuildOptions(), [rules, Step("tests", tests_fail, forkable=True), Step("later", later_fails)],
                    parallel=parallel)
        with pytest.raises(b.SpecErrors, match="dashboards broke"):  # an earlier step's error comes first
            b.build(b.BuildOptions(), [rules, Step("later", later_fails), Step("tests", tests_fail, forkable=True)],
                    parallel=parallel)


def test_a_step_forks_only_up_to_its_fork_max_slos(tmp_path):
    """A forkable step with `fork_max_slos` below the catalog's SLOs runs in this process (its memory beside the
    build's would take a large build over budget); at or above, in a child. Same files either way."""
    from bench.bench_slogen import write_specs

    options = b.BuildOptions(inputs=(str(write_specs(tmp_path, 20)),))

    def where(catalog):
        return Produced({"pid.txt": str(os.getpid())})

    for limit, forked in ((19, False), (20, True), (0, True)):
        built = b.build(options, [Step("where", where, forkable=True, fork_max_slos=limit)], parallel=True)
        assert (built.files["pid.txt"] != str(os.getpid())) is forked, limit
