"""Names slogen writes into Kubernetes objects and rules, from names a spec chose (issue 34): an object name
must be a DNS-1123 subdomain (the API server refuses `slo-Pay_API.v2`), and a class or label value with a
control character must be refused at load, whatever promtool flags the build is given."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slogen import cli
from slogen.k8smeta import ObjectMeta, object_name, subdomain_problem

SPEC = """version: "prometheus/v1"
service: "{service}"
slos:
  - name: "availability"
    objective: 99.9
    sli:
      plugin:
        id: "llmslo/availability"
        options: {{source: "tap", slo_class: {slo_class}}}
    alerting:
      name: PayAvailabilityBudgetBurn
"""


def _build(tmp_path: Path, service: str, slo_class: str = '"interactive"') -> tuple[int, Path]:
    spec = tmp_path / "slos" / "pay.yaml"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(SPEC.format(service=service, slo_class=slo_class))
    out = tmp_path / "out"
    return cli.main(["build", str(spec.parent), "--out", str(out), "--no-promtool-check"]), out


def _objects(out: Path) -> list[dict]:
    docs = [d for f in sorted(out.rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict)]
    return [d for d in docs if "kind" in d and isinstance(d.get("metadata"), dict) and "name" in d["metadata"]]


def test_a_service_name_that_is_no_object_name_gives_a_valid_derived_one(tmp_path):
    code, out = _build(tmp_path, "Pay_API.v2")
    assert code == 0
    objects = _objects(out)
    rules = [d for d in objects if d["kind"] == "PrometheusRule" and d["metadata"]["name"].startswith("slo-")]
    assert [r["metadata"]["name"] for r in rules] == [object_name("slo-Pay_API.v2")] == ["slo-pay-api.v2-283ea3dd"]
    for d in objects:  # every object the build writes: rules, dashboards' ConfigMaps, AlertmanagerConfig, ...
        assert subdomain_problem(d["metadata"]["name"]) is None, (d["kind"], d["metadata"]["name"])


@pytest.mark.parametrize("name", ["slo-Pay_API.v2", "slo-pay_api.v2", "PAY", "a..b", "-x-", "x\n", "Ä" * 300])
def test_derived_names_are_valid_deterministic_and_do_not_collide(name):
    derived = object_name(name)
    assert subdomain_problem(derived) is None and object_name(name) == derived
    assert object_name(derived) == derived  # a valid name is kept as it is
    assert ObjectMeta().metadata(name)["name"] == derived
    assert object_name("slo-Pay_API.v2") != object_name("slo-pay_api.v2")


def test_a_trailing_newline_does_not_pass_for_a_valid_name():
    assert subdomain_problem("slo-pay\n") is not None


def test_a_class_with_a_newline_is_refused_at_load_naming_file_field_and_fix(tmp_path, capsys):
    code, out = _build(tmp_path, "pay", '"inter\\nactive"')
    assert code != 0
    err = capsys.readouterr().err
    assert "pay.yaml" in err and "slo_class" in err and "control character" in err and "on one line" in err
    assert not list(out.rglob("*.rules.yaml")) if out.exists() else True  # nothing half-written
