"""The JSON Schema of slogen's inputs (issue 29, editor help): generated from the loaders' key lists, the plugin
contract and llmslo/ranges.py; committed as schemas/slogen.schema.json, referenced by every example, and it
accepts every example and refuses the typos the loader refuses."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from slogen.loaders import load_paths
from slogen.schema import SCHEMA_PATH, render

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted([*REPO.glob("slos/*.yaml"), *REPO.glob("autoscaling/*.yaml"), REPO / "demo/windows.yaml", REPO / "thresholds.yaml"])
VALIDATOR = jsonschema.Draft202012Validator(json.loads(render()))


def errors(doc) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def test_the_committed_schema_is_what_slogen_schema_writes_today(tmp_path):
    committed = REPO / SCHEMA_PATH
    assert committed.read_text(encoding="utf-8") == render(), "run: slogen schema --out " + SCHEMA_PATH
    jsonschema.Draft202012Validator.check_schema(json.loads(render()))
    cli = [sys.executable, "-m", "slogen.cli", "schema"]
    assert subprocess.run([*cli, "--check", "--out", str(committed)], cwd=REPO).returncode == 0
    stale = tmp_path / "s.json"
    stale.write_text(render().replace('"ttft"', '"ttfb"', 1))
    run = subprocess.run([*cli, "--check", "--out", str(stale)], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 1 and "is stale: run `slogen schema --out" in run.stderr
    assert subprocess.run([*cli, "--check"], cwd=REPO, capture_output=True).returncode == 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_references_the_schema_and_is_valid(path):
    first = path.read_text(encoding="utf-8").splitlines()[0]
    ref = first.removeprefix("# yaml-language-server: $schema=")
    assert ref != first, f"{path}: the first line must reference the schema"
    assert (path.parent / ref).resolve() == (REPO / SCHEMA_PATH).resolve()
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        assert errors(doc) == []


CHAT = yaml.safe_load((REPO / "slos/chat.yaml").read_text(encoding="utf-8"))
POOLS = yaml.safe_load((REPO / "autoscaling/llm-pools.yaml").read_text(encoding="utf-8"))


def _ttft(doc: dict) -> dict:
    return next(s for s in doc["slos"] if s["sli"].get("plugin", {}).get("id") == "llmslo/latency")


def _mutate(doc: dict, change) -> dict:
    out = copy.deepcopy(doc)
    change(out)
    return out


# (what, mutated document, a fragment of the schema's error): each is refused by the schema and by the loader.
TYPOS = [
    ("unknown SLO key", lambda d: _ttft(d).update(objectve=99), "'objectve' was unexpected"),
    ("unknown top-level key", lambda d: d.update(servce="chat"), "'servce' was unexpected"),
    ("misspelt plugin option", lambda d: _ttft(d)["sli"]["plugin"]["options"].update(treshold="0.5"),
     "'treshold' was unexpected"),
    ("option of another plugin", lambda d: _ttft(d)["sli"]["plugin"]["options"].update(ttft="0.5"),
     "'ttft' was unexpected"),
    ("metric not in the contract", lambda d: _ttft(d)["sli"]["plugin"]["options"].update(metric="ttfb"),
     "'ttfb' is not one of"),
    ("threshold in milliseconds", lambda d: _ttft(d)["sli"]["plugin"]["options"].update(threshold=500),
     "500 is greater than the maximum of 60"),
    ("objective as a ratio", lambda d: _ttft(d).update(objective=0.99), "0.99 is less than the minimum of 50"),
    ("misspelt alert key", lambda d: _ttft(d)["alerting"]["page_alert"].update(disabled=True),
     "'disabled' was unexpected"),
]


@pytest.mark.parametrize("what, change, says", TYPOS, ids=[t[0] for t in TYPOS])
def test_the_schema_refuses_a_typo_as_the_loader_does(what, change, says, tmp_path):
    doc = _mutate(CHAT, change)
    found = errors(doc)
    assert any(says in e for e in found), found
    spec = tmp_path / "chat.yaml"
    spec.write_text(yaml.safe_dump(doc), encoding="utf-8")
    loaded = load_paths([spec], raise_errors=False)
    assert loaded.errors or loaded.warnings, f"the loader accepts the {what} the schema refuses"


def test_allow_out_of_range_lifts_the_ranges_as_in_the_loader():
    doc = _mutate(CHAT, lambda d: (_ttft(d)["sli"]["plugin"]["options"].update(threshold=500),
                                    _ttft(d).update(allow_out_of_range=True)))
    assert errors(doc) == []


@pytest.mark.parametrize("change, says", [
    (lambda d: d["pools"][0].update(replica={"max": 3}), "'replica' was unexpected"),
    (lambda d: d["pools"][0]["triggers"].update(queue_dept={"per_replica": 4}), "'queue_dept' was unexpected"),
    (lambda d: d["pools"][0]["triggers"]["ttft_burn_rate"].update(window="1h"), "'1h' is not one of"),
])
def test_the_schema_refuses_autoscaling_typos(change, says):
    assert any(says in e for e in errors(_mutate(POOLS, change)))


def test_the_schema_refuses_a_misspelt_threshold():
    doc = yaml.safe_load((REPO / "thresholds.yaml").read_text(encoding="utf-8"))
    doc["health"]["kv_usage_treshold"] = doc["health"].pop("kv_usage_threshold")
    assert any("kv_usage_treshold" in e for e in errors(doc))
    doc = yaml.safe_load((REPO / "thresholds.yaml").read_text(encoding="utf-8"))
    doc["capacity"]["seats_low_for"] = 15
    assert errors(doc)
