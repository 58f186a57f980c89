"""`slogen validate` and the tap accept and refuse exactly the same llmslo/* SLI specs (one contract: llmslo/sli_plugins.py).

One table of specs, each run through both readers: slogen's CLI and the tap's loader. Cost: about 60 small
validations, under 2 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.tap.classes import SloConfigError, load_slo_config
from llmslo import conventions as c
from llmslo import sli_plugins as sp
from slogen.cli import main as slogen


def _slo(name: str, sli: str) -> str:
    return f"  - name: {name}\n    objective: 99\n    sli: {sli}\n    alerting: {{name: {name.title().replace('-', '')}Burn}}\n"


def _spec(*slos: str) -> str:
    return 'version: "prometheus/v1"\nservice: svc\nslos:\n' + "".join(slos)


def _plugin(pid: str, options: str, name: str = "slo") -> str:
    return _spec(_slo(name, f"{{plugin: {{id: {pid}, options: {options}}}}}"))


def _one_class(one: str, two: str) -> str:
    """Two goodput SLOs, "one" and "two", of class x, with these options beside the class."""
    return _spec(*(_slo(name, f"{{plugin: {{id: llmslo/goodput, options: {{slo_class: x, {options}}}}}}}")
                   for name, options in (("one", one), ("two", two))))


LAT, GOOD, AVAIL, KV = "llmslo/latency", "llmslo/goodput", "llmslo/availability", "llmslo/kv-headroom"

ACCEPTED = {
    "tap ttft with a class": _plugin(LAT, '{metric: ttft, threshold: "0.5", slo_class: interactive}'),
    "a YAML number": _plugin(LAT, "{metric: tpot, threshold: 0.05}"),
    "tap e2e, source written": _plugin(LAT, '{metric: e2e, threshold: "12.5", source: tap}'),
    "engine ttft on a vLLM edge": _plugin(LAT, """{metric: ttft, threshold: "0.5", source: engine, selector: '{engine="vllm"}'}"""),
    "engine ttft rounded down": _plugin(LAT, '{metric: ttft, threshold: "0.3", source: engine, threshold_rounding: down}'),
    "engine itl on an edge": _plugin(LAT, '{metric: itl, threshold: "0.025", source: engine}'),
    "goodput, both objectives": _plugin(GOOD, '{slo_class: a, ttft: "0.5", tpot: "0.05", models: "llama-*, chat-*"}'),
    "goodput, ttft only": _plugin(GOOD, '{slo_class: a, ttft: "2"}'),
    "goodput, tpot only": _plugin(GOOD, '{slo_class: a, tpot: "0.1"}'),
    "one class, two SLOs alike": _one_class('ttft: "1"', 'ttft: "1"'),
    "availability over the tap": _plugin(AVAIL, "{source: tap, slo_class: interactive}"),
    "availability over the engine": _plugin(AVAIL, '{source: engine, error_reasons: "error", models: "llama-*"}'),
    "kv headroom by default": _plugin(KV, "{}"),
    "kv headroom with a selector and by": _plugin(KV, """{threshold: "0.8", selector: '{namespace="llm"}', by: "cluster,pod"}"""),
    "a Sloth events SLI": _spec(_slo("ev", "{events: {error_query: 'sum(rate(e[{{.window}}]))', "
                                           "total_query: 'sum(rate(t[{{.window}}]))'}}")),
}

REFUSED = {
    "threshold inf": _plugin(LAT, '{metric: ttft, threshold: "inf"}'),
    "threshold .nan": _plugin(LAT, "{metric: ttft, threshold: .nan}"),
    "threshold with a unit": _plugin(LAT, '{metric: ttft, threshold: "500ms"}'),
    "threshold negative": _plugin(LAT, '{metric: ttft, threshold: "-1"}'),
    "threshold zero": _plugin(LAT, '{metric: ttft, threshold: "0"}'),
    "threshold missing": _plugin(LAT, "{metric: ttft}"),
    "threshold with an exponent": _plugin(LAT, '{metric: ttft, threshold: "0.00001"}'),
    "metric missing": _plugin(LAT, '{threshold: "0.5"}'),
    "itl over the tap": _plugin(LAT, '{metric: itl, threshold: "0.1"}'),
    "a typo in an option": _plugin(LAT, '{metric: ttft, treshold: "0.5"}'),
    "an empty option": _plugin(LAT, '{metric: ttft, threshold: "0.5", slo_class: ""}'),
    "a list for an option": _plugin(LAT, '{metric: ttft, threshold: "0.5", models: [a, b]}'),
    "rounding over the tap": _plugin(LAT, '{metric: ttft, threshold: "0.5", threshold_rounding: down}'),
    "rounding unknown": _plugin(LAT, '{metric: ttft, threshold: "0.3", source: engine, threshold_rounding: nearest}'),
    "engine threshold off every edge": _plugin(LAT, '{metric: ttft, threshold: "0.3", source: engine}'),
    "engine selector picks no kind": _plugin(LAT, """{metric: ttft, threshold: "0.5", source: engine, selector: '{engine="vlm"}'}"""),
    "slo_class at the engine": _plugin(LAT, '{metric: ttft, threshold: "0.5", source: engine, slo_class: a}'),
    "source unknown": _plugin(LAT, '{metric: ttft, threshold: "0.5", source: gateway}'),
    "selector not in braces": _plugin(LAT, """{metric: ttft, threshold: "0.5", selector: 'namespace="llm"'}"""),
    "by not a label": _plugin(LAT, '{metric: ttft, threshold: "0.5", by: "not a label"}'),
    "goodput without a class": _plugin(GOOD, '{ttft: "0.5", tpot: "0.05"}'),
    "goodput without objectives": _plugin(GOOD, "{slo_class: a}"),
    "goodput ttft inf": _plugin(GOOD, '{slo_class: a, ttft: "inf", tpot: "0.05"}'),
    "goodput tpot with a unit": _plugin(GOOD, '{slo_class: a, tpot: "50ms"}'),
    "goodput unknown option": _plugin(GOOD, '{slo_class: a, ttft: "1", e2e: "10"}'),
    "one class, two definitions": _one_class('ttft: "1"', 'ttft: "2"'),
    "one class, other models": _one_class('ttft: "1", models: "a-*"', 'ttft: "1", models: "b-*"'),
    "error_reasons over the tap": _plugin(AVAIL, '{source: tap, error_reasons: "error"}'),
    "an unknown finished reason": _plugin(AVAIL, '{source: engine, error_reasons: "oops"}'),
    "every finished reason bad": _plugin(AVAIL, '{source: engine, error_reasons: "' + ",".join(c.FINISHED_REASONS) + '"}'),
    "availability slo_class at the engine": _plugin(AVAIL, "{source: engine, slo_class: a}"),
    "kv threshold above 1": _plugin(KV, '{threshold: "1.5"}'),
    "kv threshold zero": _plugin(KV, '{threshold: "0"}'),
    "an unknown llmslo plugin": _plugin("llmslo/latncy", '{metric: ttft, threshold: "0.5"}'),
    "options not a mapping": _plugin(LAT, '"metric=ttft"'),
}


def _slogen_accepts(root: Path, capsys: pytest.CaptureFixture[str]) -> bool:
    code = slogen(["validate", str(root)])
    err = capsys.readouterr().err
    assert code in (0, 1), err
    return code == 0


def _tap_accepts(root: Path) -> bool:
    try:
        load_slo_config([root])
    except SloConfigError:
        return False
    return True


@pytest.mark.parametrize("case", sorted(ACCEPTED) + sorted(REFUSED))
def test_slogen_validate_and_the_tap_agree(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One level below the given directory: both find SLO files recursively (llmslo.specfile.discover).
    spec = ACCEPTED.get(case) or REFUSED[case]
    (tmp_path / "team" / "chat").mkdir(parents=True)
    (tmp_path / "team" / "chat" / "slos.yaml").write_text(spec)
    expected = case in ACCEPTED
    assert _slogen_accepts(tmp_path, capsys) is expected, f"slogen validate: {case}"
    assert _tap_accepts(tmp_path) is expected, f"the tap: {case}"


def test_the_outcome_split_covers_every_tap_outcome_once() -> None:
    """ok, bad and neutral partition the tap's outcomes; late ones are bad (the contract's TAP_OUTCOMES)."""
    split = sp.TAP_OUTCOMES
    parts = [split.ok, *split.bad, *split.neutral]
    assert sorted(parts) == sorted(c.OUTCOMES) and len(parts) == len(set(parts))
    assert set(split.late) <= set(split.bad)


def test_resolved_parameters_travel_with_the_sli() -> None:
    """Later stages read EventsSLI.params (frozen, typed), not the option strings."""
    from slogen.plugins import sli_plugin
    from slogen.plugins.contract import SLIPluginRequest

    req = SLIPluginRequest("svc", "s", "svc-s", 99.0, {},
                           {"metric": "ttft", "threshold": "0.3", "source": "engine", "threshold_rounding": "down"})
    sli = sli_plugin(sp.LATENCY)(req)  # type: ignore[misc]
    assert isinstance(sli.params, sp.LatencyParams)
    assert (sli.params.threshold, sli.params.threshold_written, sli.params.rounded) == (0.1, 0.3, True)
    with pytest.raises(AttributeError):
        sli.params.threshold = 1.0  # type: ignore[misc]
