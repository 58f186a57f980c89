"""Goodput classes and tap thresholds from SLO YAML, request-to-class mapping, and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.tap.classes import SloConfig, SloConfigError, load_slo_config

SPEC = """\
version: "prometheus/v1"
service: "chat"
labels: {team: inference}
slos:
  - name: "goodput-interactive"
    objective: 95
    sli:
      plugin:
        id: "llmslo/goodput"
        options: {slo_class: "interactive", ttft: "0.5", tpot: "0.05", models: "llama-3-8b, chat-*"}
    alerting: {name: GoodputInteractive}
  - name: "goodput-batch"
    objective: 90
    sli:
      plugin:
        id: "llmslo/goodput"
        options: {slo_class: "batch", ttft: "5", tpot: "0.2", models: "batch-*"}
  - name: "goodput-default"
    objective: 90
    sli:
      plugin:
        id: "llmslo/goodput"
        options: {slo_class: "default", ttft: "2", tpot: "0.1"}
  - name: "ttft-p99"
    objective: 99
    sli:
      plugin:
        id: "llmslo/latency"
        options: {metric: "ttft", threshold: "0.35", source: "tap", slo_class: "interactive"}
  - name: "e2e"
    objective: 99
    sli:
      plugin:
        id: "llmslo/latency"
        options: {metric: "e2e", threshold: "12.5", source: "tap"}
  - name: "tpot-default-source"
    objective: 99
    sli:
      plugin:
        id: "llmslo/latency"
        options: {metric: "tpot", threshold: "0.07"}
  - name: "engine-itl"
    objective: 99
    sli:
      plugin:
        id: "llmslo/latency"
        options: {metric: "itl", threshold: "0.025", source: "engine"}
  - name: "availability"
    objective: 99.9
    sli: {plugin: {id: "llmslo/availability", options: {source: "tap"}}}
  - name: "raw"
    objective: 99
    sli: {events: {error_query: "x", total_query: "y"}}
"""

CRD = """\
apiVersion: sloth.slok.dev/v1
kind: PrometheusServiceLevel
metadata: {name: code}
spec:
  service: code
  slos:
    - name: goodput-code
      objective: 95
      sli:
        plugin:
          id: llmslo/goodput
          options: {slo_class: code, ttft: "0.25", tpot: "0.03", models: "coder-*"}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_loads_classes_and_every_tap_threshold(tmp_path: Path) -> None:
    cfg = load_slo_config([write(tmp_path, "chat.yaml", SPEC)])
    assert cfg.class_names == ("interactive", "batch", "default")
    interactive = cfg.classes[0]
    assert (interactive.ttft, interactive.tpot, interactive.models) == (0.5, 0.05, ("llama-3-8b", "chat-*"))
    assert cfg.thresholds == {"ttft": (0.35, 0.5, 2.0, 5.0), "tpot": (0.05, 0.07, 0.1, 0.2), "e2e": (12.5,)}


def test_directories_and_multi_document_files(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", SPEC)
    write(tmp_path, "b.yml", "---\n" + CRD + "---\nkind: Other\n")
    write(tmp_path, "notes.txt", "not yaml: [")
    cfg = load_slo_config([tmp_path])
    assert cfg.class_names == ("interactive", "batch", "default", "code")
    assert 0.25 in cfg.thresholds["ttft"] and 0.03 in cfg.thresholds["tpot"]


@pytest.mark.parametrize(
    ("headers", "model", "expect"),
    [
        ({}, "llama-3-8b", ("interactive", 0.5, 0.05)),
        ({}, "chat-large", ("interactive", 0.5, 0.05)),
        ({}, "batch-7b", ("batch", 5.0, 0.2)),
        ({}, "unknown-model", ("default", 2.0, 0.1)),
        ({}, "", ("default", 2.0, 0.1)),
        ({"x-slo-class": "batch"}, "chat-large", ("batch", 5.0, 0.2)),
        ({"x-slo-class": "no-such-class"}, "chat-large", ("interactive", 0.5, 0.05)),
        ({"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}, "batch-1", ("batch@ttft250-tpot20", 0.25, 0.02)),
        ({"x-slo-ttft-ms": "270"}, "batch-1", ("batch@ttft250-tpot200", 0.25, 0.2)),  # snapped down, class's TPOT
        ({"x-slo-ttft-ms": "-1", "x-slo-tpot-ms": "fast"}, "batch-1", ("batch", 5.0, 0.2)),
        ({"x-slo-ttft-ms": "nan"}, "batch-1", ("batch", 5.0, 0.2)),
    ],
)
def test_request_to_class(tmp_path: Path, headers: dict[str, str], model: str, expect: tuple) -> None:
    cfg = load_slo_config([write(tmp_path, "chat.yaml", SPEC)])
    o = cfg.resolve(headers, model)
    assert (o.slo_class, o.ttft, o.tpot) == expect


def test_without_default_the_first_class_catches_the_rest(tmp_path: Path) -> None:
    cfg = load_slo_config([write(tmp_path, "code.yaml", CRD)])
    assert cfg.resolve({}, "llama").slo_class == "code"


def test_no_files_means_one_implicit_class_without_objectives() -> None:
    cfg = load_slo_config([])
    o = cfg.resolve({}, "anything")
    assert (o.slo_class, o.ttft, o.tpot) == ("default", None, None)
    assert cfg.thresholds == {"ttft": (), "tpot": (), "e2e": ()}
    assert SloConfig((), {}).class_names == ("default",)


def goodput_slo(options: str, name: str = "g") -> str:
    return f"""version: prometheus/v1
service: s
slos:
  - name: {name}
    objective: 95
    sli: {{plugin: {{id: llmslo/goodput, options: {options}}}}}
"""


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (goodput_slo('{ttft: "0.5", tpot: "0.05"}'), ["SLO 'g'", "slo_class", "missing"]),
        (goodput_slo('{slo_class: a, ttft: "500ms", tpot: "0.05"}'), ["SLO 'g'", "options.ttft", "'500ms'", '"0.5"']),
        (goodput_slo('{slo_class: a, ttft: "0.5", tpot: "-1"}'), ["options.tpot", "positive"]),
        (goodput_slo("{slo_class: a}"), ["ttft and/or tpot"]),
        (goodput_slo('{slo_class: a, ttft: "1", models: [a, b]}'), ["options.models", "comma-separated"]),
        (
            goodput_slo("{metric: itl, threshold: '0.1', source: tap}").replace("llmslo/goodput", "llmslo/latency"),
            ["options.source", "'itl'", "source: engine"],
        ),
        (
            goodput_slo("{metric: ttft, source: tap}").replace("llmslo/goodput", "llmslo/latency"),
            ["options.threshold", "missing"],
        ),
        ("version: prometheus/v1\nslos: {a: 1}\n", ["slos must be a list"]),
        ("version: prometheus/v1\nslos: [\n", ["not valid YAML"]),
    ],
)
def test_errors_name_file_slo_and_field(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(SloConfigError) as err:
        load_slo_config([path])
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_conflicting_class_definitions_are_an_error(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", goodput_slo('{slo_class: x, ttft: "1", tpot: "0.1"}', name="one"))
    b = write(tmp_path, "b.yaml", goodput_slo('{slo_class: x, ttft: "2", tpot: "0.1"}', name="two"))
    with pytest.raises(SloConfigError, match=r"b\.yaml: SLO 'two'.*'x'.*a\.yaml: SLO 'one'"):
        load_slo_config([a, b])
    same = write(tmp_path, "c.yaml", goodput_slo('{slo_class: x, ttft: "1", tpot: "0.1"}', name="three"))
    assert load_slo_config([a, same]).class_names == ("x",)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SloConfigError, match="cannot read the SLO file"):
        load_slo_config([tmp_path / "nope.yaml"])


def test_the_projects_own_slo_files_load() -> None:
    """slos/ is the spec slogen compiles: the tap must accept it and find its goodput classes."""
    slos = Path(__file__).resolve().parents[2] / "slos"
    cfg = load_slo_config([slos])
    names = set(cfg.class_names)
    assert {"interactive", "batch"} <= names
    for cls in cfg.classes:
        assert cls.ttft is None or cls.ttft in cfg.thresholds["ttft"]
        assert cls.tpot is None or cls.tpot in cfg.thresholds["tpot"]


def test_model_globs_select_the_same_models_as_slogens_promql_matchers() -> None:
    """The tap classifies with the glob reading slogen writes into `model=~"..."`: `[` is literal, not a set."""
    import re

    from exporter.tap.classes import SloClass
    from llmslo.globs import glob_regex

    globs = ("llama-3-8b*", "chat-[x]", "qwen?")
    cls = SloClass("interactive", 0.5, 0.05, globs)
    for model in ("llama-3-8b-instruct", "chat-[x]", "chat-x", "qwen2", "qwen25", "mistral", "xllama-3-8b"):
        promql = re.fullmatch(glob_regex(",".join(globs)), model) is not None
        assert cls.matches(model) == promql, model
    assert cls.matches("chat-[x]") and not cls.matches("chat-x")


def test_long_client_chosen_model_names_are_not_cached() -> None:
    """Clients choose `model`: caching 1 MiB names would let them fill the tap's memory."""
    from exporter.tap.classes import SloClass, SloConfig

    cfg = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {})
    for i in range(50):
        assert cfg.class_for_model("x" * 1_000_000 + str(i)).name == "interactive"
    assert cfg.class_for_model("chat-a").name == "interactive"
    assert len(cfg._model_cache) == 1 and max(map(len, cfg._model_cache)) <= 200
