"""slogen/artifacts/jsontext.py writes json.dumps(indent=2, sort_keys=True)'s bytes: on every value kind, on
escapes, on what it hands back to json, and on the dashboards a build makes."""

from __future__ import annotations

import json

import pytest

from slogen.artifacts import dashboards as d
from slogen.artifacts import grafana as gf
from slogen.artifacts.jsontext import indented


def _json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


CASES = [
    {},
    [],
    "plain",
    {"b": 1, "a": [1, 2.5, -0.0, 1e-07, 1e16, 123456789012345678901234567890], "c": {"z": None, "y": True, "x": False}},
    {"nested": [[], {}, [[{}]], {"k": []}], "deep": {"a": {"b": {"c": [1, {"d": "e"}]}}}},
    {"esc": "quote \" backslash \\ tab \t newline \n nul \x00 del \x7f", "uni": "é ü 中 😀 \u2028"},
    {"\u00e9 key": 1, "\"quoted\"": 2, "": 3, "Z": 4, "a": 5},
    {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")},
    {"expr": 'sum(rate(x{a="b",c=~"d|e"}[5m])) / ignoring(le) {x: [1, 2]}'},
]


@pytest.mark.parametrize("obj", CASES)
def test_every_value_kind_is_written_as_json_writes_it(obj):
    assert indented(obj) == _json(obj)


@pytest.mark.parametrize("obj", [{1: "int key"}, {"t": (1, 2)}, {"k": {True: 1}, "z": [None]}])
def test_what_it_does_not_write_goes_to_json(obj):
    """Keys that are not strings and tuples are json's to convert: the same text (or json's own error)."""
    assert indented(obj) == _json(obj)


def test_an_object_json_refuses_is_refused_the_same_way():
    with pytest.raises(TypeError):
        indented({"x": object()})


def test_a_builds_dashboards_are_the_bytes_json_wrote(sample_slos):
    models = [gf.dashboard_json(d.fleet_dashboard(sample_slos)), gf.dashboard_json(d.overview_dashboard(sample_slos))]
    models += [gf.dashboard_json(d.slo_dashboard(s)) for s in sample_slos]
    assert all(indented(m) == _json(m) for m in models)
    assert gf.render(d.fleet_dashboard(sample_slos)) == _json(models[0]) + "\n"
