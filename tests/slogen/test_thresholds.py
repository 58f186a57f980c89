"""The health and capacity thresholds file: the checked-in one is the built-in defaults, every threshold in it;
a value in a file changes the rules, a flag wins over the file; every problem of a file in one run, with lines."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from llmslo.durations import parse_prometheus_duration
from llmslo.specfile import load_documents
from slogen import cli, scaffold, thresholdargs, thresholds
from slogen.errors import SpecErrors
from slogen.rules.capacity import CapacityOptions
from slogen.rules.health import HealthOptions
from slogen.rules.knobs import thresholds_of

REPO = Path(__file__).resolve().parents[2]
SLOS = str(REPO / "slos")


def test_the_checked_in_file_names_every_threshold_at_its_default():
    doc = load_documents((REPO / thresholds.DEFAULT_NAME).read_bytes())[0]
    for section, cls in (("health", HealthOptions), ("capacity", CapacityOptions)):
        defaults = cls()
        written = doc[section]
        assert set(written) == set(thresholds.settable(cls)), section  # every threshold, nothing else
        for name, kind in thresholds.settable(cls).items():
            value = parse_prometheus_duration(written[name]) if kind is int else written[name]
            assert value == getattr(defaults, name), (section, name)
    loaded = thresholds.load(REPO / thresholds.DEFAULT_NAME)
    assert thresholds.options(HealthOptions, loaded.health, {}, True) == HealthOptions()
    assert thresholds.options(CapacityOptions, loaded.capacity, {}, True) == CapacityOptions()


def _health_rules(tmp_path: Path, *argv: str) -> str:
    out = tmp_path / "out"
    assert cli.main(["build", SLOS, "--out", str(out), "--no-promtool-check", *argv]) == 0
    return (out / "alerts" / "llmslo-health.rules.yaml").read_text()


def test_a_value_in_the_file_changes_the_rules_and_a_flag_wins_over_it(tmp_path):
    file = tmp_path / "thresholds.yaml"
    file.write_text('version: "llmslo/thresholds/v1"\nhealth:\n  kv_usage_threshold: 0.9\n  kv_saturated_for: 20m\n')
    from_file = _health_rules(tmp_path, "--thresholds", str(file))
    assert "llm_kv_cache_usage_ratio > 0.9\n" in from_file and "for: 20m" in from_file
    flagged = _health_rules(tmp_path, "--thresholds", str(file), "--kv-usage-threshold", "0.8")
    assert "llm_kv_cache_usage_ratio > 0.8\n" in flagged and "for: 20m" in flagged  # the flag, and the file's rest
    assert "llm_kv_cache_usage_ratio > 0.95\n" in _health_rules(tmp_path)  # the repo's file: the defaults


def test_the_default_file_is_found_beside_the_inputs(tmp_path):
    (tmp_path / "slos").mkdir()
    (tmp_path / "slos" / "a.yaml").write_text((REPO / "slos" / "chat.yaml").read_text())
    assert thresholds.path_for([str(tmp_path / "slos")], None) is None  # none there: the built-in defaults
    (tmp_path / thresholds.DEFAULT_NAME).write_text('version: "llmslo/thresholds/v1"\n')
    assert thresholds.path_for([str(tmp_path / "slos")], None) == tmp_path / thresholds.DEFAULT_NAME
    assert thresholds.path_for([str(tmp_path / "slos")], "other.yaml") == Path("other.yaml")


BAD = """\
version: "llmslo/thresholds/v2"
health:
  kv_usage_treshold: 0.9
  gpu_lost_for: soon
  kv_usage_threshold: 2
  preemption_rate: .nan
capacitty: {}
capacity:
  seats_low: "many"
  exhaustion_for: 30m
"""


def test_every_problem_of_a_file_comes_back_at_once_with_its_line_and_fix(tmp_path):
    file = tmp_path / "t.yaml"
    file.write_text(BAD)
    with pytest.raises(SpecErrors) as err:
        thresholds.load(file)
    got = sorted((e.line, e.field) for e in err.value.errors)
    assert got == [(1, "version"), (3, "health.kv_usage_treshold"), (4, "health.gpu_lost_for"),
                   (5, "health.kv_usage_threshold"), (6, "health.preemption_rate"), (7, "capacitty"),
                   (9, "capacity.seats_low"), (10, "capacity.exhaustion_for")]
    fixes = {e.field: e.fix for e in err.value.errors}
    assert fixes["health.kv_usage_treshold"] == "did you mean 'kv_usage_threshold'?"
    assert fixes["capacitty"] == "did you mean 'capacity'?"


def test_validate_refuses_what_build_refuses(tmp_path, capsys):
    file = tmp_path / "t.yaml"
    file.write_text(BAD)
    assert cli.main(["validate", SLOS, "--thresholds", str(file)]) == 1
    validated = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert cli.main(["build", SLOS, "--check", "--thresholds", str(file)]) == 1
    built = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert validated == built and len(built) == 8


def test_options_keep_the_defaults_the_file_leaves_out():
    got = thresholds.options(HealthOptions, {"kv_usage_threshold": 0.5}, {"preemption_rate": None}, True)
    assert got == dataclasses.replace(HealthOptions(), kv_usage_threshold=0.5)


def test_every_threshold_has_one_build_flag_of_its_kind():
    subparsers = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    build = subparsers.choices["build"]
    by_dest = {a.dest: a for a in build._actions}
    for prefix, cls in (("", HealthOptions), ("capacity_", CapacityOptions)):
        for name, kind in thresholds.settable(cls).items():
            action = by_dest[prefix + name]
            assert action.default is None, name  # None: the file's value, else the built-in default, stands
            assert action.type is (thresholdargs.duration if kind is int else thresholdargs.finite), name


def _build_flags() -> dict[str, argparse.Action]:
    subparsers = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in subparsers.choices["build"]._actions for o in a.option_strings}


def test_each_threshold_is_written_once_and_the_flag_file_and_docs_say_it():
    flags, text = _build_flags(), (REPO / thresholds.DEFAULT_NAME).read_text()
    docs = (REPO / "docs" / "slogen.md").read_text()
    for section, cls in thresholds.SECTIONS.items():
        for t in thresholds_of(cls):
            action = flags[thresholds.flag(section, t)]
            assert action.help == f"{t.help()} (default {t.show(t.default)})" and action.metavar == t.knob.metavar
            assert f"  {t.name}: {t.show(t.default)}\n" in text  # the value line, under its comment
            assert f"| `{section}.{t.name}` | `{thresholds.flag(section, t)} {t.knob.metavar}` | {t.show(t.default)} |" in docs
    # the committed file, the docs table and `slogen init`'s file are what the rows make, to the byte
    assert text == thresholds.render(thresholdargs.SCHEMA_REF), "run `slogen thresholds --out thresholds.yaml`"
    assert cli.main(["thresholds", "--format", "markdown", "--out", str(REPO / "docs" / "slogen.md"), "--check"]) == 0
    assert scaffold._thresholds() == thresholds.render(scaffold.SCHEMA_URL)


def test_a_changed_row_makes_the_committed_file_and_docs_stale(tmp_path, monkeypatch, capsys):
    (tmp_path / "t.yaml").write_text(thresholds.render(thresholdargs.SCHEMA_REF))
    (tmp_path / "d.md").write_text(f"x\n{thresholds.TABLE_BEGIN}\nold\n{thresholds.TABLE_END}\ny\n")
    assert cli.main(["thresholds", "--out", str(tmp_path / "t.yaml"), "--check"]) == 0
    assert cli.main(["thresholds", "--format", "markdown", "--out", str(tmp_path / "d.md"), "--check"]) == 1
    assert cli.main(["thresholds", "--format", "markdown", "--out", str(tmp_path / "d.md")]) == 0
    assert (tmp_path / "d.md").read_text() == f"x\n{thresholds.TABLE_BEGIN}\n{thresholds.table()}{thresholds.TABLE_END}\ny\n"
    row = next(t for t in thresholds_of(HealthOptions) if t.name == "kv_usage_threshold")
    moved = dataclasses.replace(row, knob=dataclasses.replace(row.knob, sets="something else"))
    monkeypatch.setattr(thresholds, "thresholds_of", lambda cls: tuple(moved if t.name == row.name else t
                                                                      for t in thresholds_of(cls)))
    assert cli.main(["thresholds", "--out", str(tmp_path / "t.yaml"), "--check"]) == 1
    assert "is stale" in capsys.readouterr().err


def test_a_value_out_of_its_rows_range_is_refused_with_the_rows_words():
    assert HealthOptions(kv_usage_threshold=1.0).problems() == [
        ("kv_usage_threshold", "is 1; write a ratio between 0 and 1, e.g. 0.95")]
    assert HealthOptions(tap_refusal_rate=0.0).problems() == []  # 0 is in its range: any refusal
    assert [n for n, _ in HealthOptions(preemption_rate=0.0, gpu_lost_for=90_000).problems()] == [
        "gpu_lost_for", "preemption_rate"]
    assert CapacityOptions(seats_low=float("nan")).problems() == [
        ("capacity_seats_low", "is nan; write a positive number of seats, e.g. 4")]
