"""Engine thresholds that fit the engines a user runs (issue 29): `engine_versions` and `buckets`.

Before, an engine-sourced threshold had to be an edge of every version of every selected engine kind in
llmslo/bucket_edges.py: an SGLang TTFT of 5 s was refused (SGLang 0.5 lacks 5) and 4 s too (SGLang <0.4.6
lacks 4). A spec now says which versions it runs and which custom buckets its engines use, and the check
uses exactly those (llmslo/engine_versions.py), in slogen and in the tap (one option reader).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.plugin_errors import PluginOptionError
from llmslo.sli_plugins import read_options

REPO = Path(__file__).resolve().parents[2]
SGLANG = {"metric": "ttft", "source": "engine", "selector": '{engine="sglang"}'}
BOTH = {"metric": "ttft", "source": "engine", "selector": '{engine=~"sglang|vllm"}'}


def threshold(**options) -> float:
    return read_options("llmslo/latency", options).threshold


def refusal(**options) -> PluginOptionError:
    with pytest.raises(PluginOptionError) as err:
        read_options("llmslo/latency", options)
    return err.value


def test_five_seconds_is_refused_without_a_declaration_and_the_fix_names_the_versions_that_have_it():
    e = refusal(**SGLANG, threshold="5")
    assert "sglang 0.5: 4 < 5 < 6" in str(e)
    assert 'engine_versions: "sglang<0.4.6"' in e.fix
    assert 'buckets: "sglang: <edges, seconds>"' in e.fix


@pytest.mark.parametrize("versions", ["sglang<0.4.6", "sglang==0.4.5", "sglang<=0.4.5, sglang>0.3"])
def test_five_seconds_is_accepted_when_every_declared_sglang_version_has_the_edge(versions):
    assert threshold(**SGLANG, threshold="5", engine_versions=versions) == 5.0


def test_declared_versions_of_two_kinds_that_all_have_the_edge_are_accepted():
    assert threshold(**BOTH, threshold="5", engine_versions="sglang<0.4.6, vllm>=0.11") == 5.0
    assert threshold(**BOTH, threshold="4", engine_versions="sglang>=0.5") == 4.0  # vLLM not run: not checked


@pytest.mark.parametrize("versions", ["sglang", "sglang>=0.5", "sglang<0.4.6, vllm==0.6.6"])
def test_a_declared_version_lacking_the_edge_is_named_with_the_declared_edges(versions):
    e = refusal(**BOTH, threshold="4" if versions.startswith("sglang<") else "5", engine_versions=versions)
    text = str(e)
    assert e.option == "threshold"
    assert "Edges of the declared engines:" in text
    if versions == "sglang":
        assert "sglang 0.5: 4 < 5 < 6" in text and "sglang <0.4.6" not in text.split("Nearest edges")[1].split(".")[0]
        assert "sglang 0.5: 0.1, 0.2, 0.4, 0.6" in text
    elif versions == "sglang>=0.5":
        assert "sglang 0.5: 4 < 5 < 6" in text and "sglang <0.4.6" not in text
    else:  # 4 s: SGLang <0.4.6 and vLLM 0.6 both lack it, vLLM >=0.11 is not run
        assert "sglang <0.4.6: 2.5 < 4 < 5" in text and "vllm 0.6 (V0): 2.5 < 4 < 5" in text
        assert ">=0.11" not in text


def test_versions_no_table_row_covers_are_refused_with_the_known_ranges():
    e = refusal(**SGLANG, threshold="4", engine_versions="sglang>=0.4")
    assert e.option == "engine_versions"
    assert "no bucket table covers sglang >=0.4.6, <0.5" in str(e)
    assert "sglang 0.5 (>=0.5); sglang <0.4.6 (<0.4.6)" in e.fix


def test_custom_buckets_make_an_otherwise_unknown_edge_valid():
    assert refusal(**SGLANG, threshold="3").option == "threshold"  # 3 s is no SGLang edge in any version
    assert threshold(**SGLANG, threshold="3", buckets="sglang: 0.5, 1, 3, 5") == 3.0
    assert threshold(**SGLANG, threshold="3", buckets="1, 3") == 3.0  # no kind: every kind measured
    e = refusal(**SGLANG, threshold="2", buckets="sglang: 0.5, 1, 3, 5")
    assert "sglang (custom buckets): 1 < 2 < 3" in str(e) and "Edges of the declared engines" in str(e)
    # vLLM keeps its table's edges while SGLang's are declared
    e = refusal(**BOTH, threshold="3", buckets="sglang: 1, 3")
    assert "vllm >=0.11, 0.10, 0.6 (V0): 2.5 < 3 < 5" in str(e)


@pytest.mark.parametrize("options, option, says", [
    ({"engine_versions": "sglnag>=0.5"}, "engine_versions", "did you mean sglang?"),
    ({"engine_versions": "sglang~0.5"}, "engine_versions", "sglang>=0.5, vllm==0.11.2"),
    ({"engine_versions": "sglang>=0.5, sglang<0.5"}, "engine_versions", "leave no version"),
    ({"engine_versions": "vllm>=0.11"}, "engine_versions", "none of which the selector picks"),
    ({"buckets": "sglang: 1, fast"}, "buckets", "not a positive number"),
    ({"buckets": "vllm: 1, 5"}, "buckets", "does not measure"),
    ({"buckets": "sglang: 1; sglang: 5"}, "buckets", "twice"),
])
def test_option_errors(options, option, says):
    e = refusal(**SGLANG, threshold="5", **options)
    assert e.option == option
    assert says in f"{e} {e.fix}"


def test_tap_sourced_slis_refuse_the_engine_options():
    e = refusal(metric="ttft", threshold="0.5", engine_versions="sglang>=0.5")
    assert e.option == "engine_versions" and "source: engine only" in str(e)


def test_slogen_validate_names_the_file_field_and_fix(tmp_path):
    spec = tmp_path / "sglang.yaml"
    body = ('version: "prometheus/v1"\nservice: "svc"\nslos:\n  - name: "ttft"\n    objective: 99\n    sli:\n'
            '      plugin:\n        id: "llmslo/latency"\n        options:\n          metric: "ttft"\n'
            '          threshold: "5"\n          source: "engine"\n          selector: \'{engine="sglang"}\'\n'
            '          engine_versions: "{versions}"\n    alerting:\n      name: SvcTTFT\n')
    spec.write_text(body.replace("{versions}", "sglang>=0.5"))
    run = subprocess.run([sys.executable, "-m", "slogen.cli", "validate", str(spec)], capture_output=True,
                         text=True, cwd=REPO)
    assert run.returncode == 1
    assert "sglang.yaml:11: SLO 'svc-ttft': field slos[0].sli.plugin.options.threshold" in run.stderr
    assert "Edges of the declared engines: sglang 0.5: 0.1, 0.2, 0.4" in run.stderr
    spec.write_text(body.replace("{versions}", "sglang<0.4.6"))
    ok = subprocess.run([sys.executable, "-m", "slogen.cli", "validate", str(spec)], capture_output=True,
                        text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
