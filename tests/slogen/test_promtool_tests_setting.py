"""`promtoolTests` in llmslo.yaml: on by default (a user's CI runs the generated tests), off in this repository,
which builds them in its suite instead of committing them. Off, the build writes every other file as it would."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from slogen import settings
from slogen.build import build
from slogen.catalog import BuildOptions
from slogen.cli import main
from slogen.errors import SpecErrors
from slogen.paths import DASHBOARD_TESTS_FILE, is_promtool_test, rules_path
from slogen.paths import tests_path as service_tests_path  # not `test*`: pytest would collect it

REPO = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "llmslo.yaml"
    path.write_text(f"version: {settings.VERSION}\n{extra}")
    return path


def test_the_setting_is_read_and_on_by_default(tmp_path: Path) -> None:
    assert settings.InstallSettings().promtool_tests
    assert settings.load(_settings(tmp_path, "")).promtool_tests
    assert not settings.load(_settings(tmp_path, "promtoolTests: false\n")).promtool_tests
    assert BuildOptions().promtool_tests  # no settings at all: a plain build writes them


@pytest.mark.parametrize("value", ['"false"', "0", "no-thanks"])
def test_a_value_that_is_not_true_or_false_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(SpecErrors) as e:
        settings.load(_settings(tmp_path, f"promtoolTests: {value}\n"))
    assert "promtoolTests" in str(e.value) and "true or false" in str(e.value)


def test_init_writes_the_setting_and_reads_it_back(tmp_path: Path) -> None:
    for on in (True, False):
        path = tmp_path / f"{on}.yaml"
        image = f"{settings.IMAGE_NAME}@sha256:{'a' * 64}"  # init refuses the placeholder digest, and so does load
        path.write_text(settings.render(settings.InstallSettings(image=image, promtool_tests=on)))
        assert settings.load(path).promtool_tests is on


def test_off_the_build_leaves_out_exactly_the_promtool_tests() -> None:
    on = BuildOptions(inputs=(str(REPO / "slos"),), install=settings.InstallSettings())
    with_tests = build(on).files
    without = build(replace(on, install=settings.InstallSettings(promtool_tests=False))).files
    left_out = set(with_tests) - set(without)
    assert {service_tests_path("chat"), DASHBOARD_TESTS_FILE, service_tests_path("llmslo-health")} <= left_out
    assert all(is_promtool_test(p) for p in left_out) and not any(is_promtool_test(p) for p in without)
    assert set(without) <= set(with_tests) and rules_path("chat") in without
    assert {p: str(without[p]) for p in without} == {p: str(with_tests[p]) for p in without}  # byte for byte


def test_a_build_with_tests_off_calls_committed_test_files_stale(tmp_path: Path, monkeypatch, capsys) -> None:
    shutil.copytree(REPO / "slos", tmp_path / "slos")
    monkeypatch.chdir(tmp_path)
    assert main(["build"]) == 0 and (tmp_path / service_tests_path("chat")).is_file()
    _settings(tmp_path, "promtoolTests: false\n")
    assert main(["build", "--check"]) == 1
    assert f"{service_tests_path('chat')}: no longer generated" in capsys.readouterr().err
    assert main(["build"]) == 0 and main(["build", "--check"]) == 0
    assert not (tmp_path / service_tests_path("chat")).exists() and not (tmp_path / DASHBOARD_TESTS_FILE).exists()
    assert (tmp_path / rules_path("chat")).is_file()


def test_this_repository_commits_no_promtool_tests() -> None:
    assert not settings.load(REPO / "llmslo.yaml").promtool_tests
    committed = [p.relative_to(REPO).as_posix() for d in ("alerts", "dashboards") for p in (REPO / d).iterdir()]
    assert committed and not [p for p in committed if is_promtool_test(p)]


def test_off_the_dashboards_tests_are_not_made(monkeypatch) -> None:
    """Not written, not computed: the dashboards step makes no DashboardTests (its answers for every panel)."""
    from slogen import steps

    made = []
    real = steps.DashboardTests
    monkeypatch.setattr(steps, "DashboardTests", lambda views: made.append(1) or real(views))
    on = BuildOptions(inputs=(str(REPO / "slos"),), install=settings.InstallSettings())
    build(replace(on, install=settings.InstallSettings(promtool_tests=False)), parallel=False)
    assert not made
    assert DASHBOARD_TESTS_FILE in build(on, parallel=False).files and made == [1]
