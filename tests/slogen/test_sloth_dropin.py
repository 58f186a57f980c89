"""`slogen generate` is a drop-in for `sloth generate`: Sloth's rules by default, slogen's with --llm-extras."""

from __future__ import annotations

import yaml

from slogen.cli import main

from tests.slogen.test_golden import expected, version


def _alerts(text: str) -> list[dict]:
    return [r for d in yaml.safe_load_all(text) if d for g in d["groups"] for r in g["rules"] if "alert" in r]


def test_generate_without_flags_is_sloths_output(sloth_testdata, capsys):
    ver = version(capsys)
    assert main(["generate", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    out = capsys.readouterr().out
    assert list(yaml.safe_load_all(out)) == expected(sloth_testdata / "out-base.yaml.tpl", ver)
    assert sorted(a["labels"]["sloth_severity"] for a in _alerts(out)) == ["page", "ticket"]


def test_llm_extras_gives_slogens_tiers(sloth_testdata, capsys):
    assert main(["generate", "--llm-extras", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    alerts = _alerts(capsys.readouterr().out)
    assert len(alerts) > 2 and {a["labels"].get("slo_tier") for a in alerts} >= {"page-quick", "ticket-slow"}


def test_sloth_compat_is_a_noop_alias_and_contradicts_llm_extras(sloth_testdata, capsys):
    assert main(["generate", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", "--sloth-compat", "-i", str(sloth_testdata / "in-base.yaml")]) == 0
    assert capsys.readouterr().out == plain
    assert main(["generate", "--sloth-compat", "--llm-extras", "-i", str(sloth_testdata / "in-base.yaml")]) == 2
    assert "--llm-extras" in capsys.readouterr().err
