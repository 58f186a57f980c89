"""Config file loading, its error messages, and merging with CLI flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter import adapters
from exporter.config import (
    ENGINE_KINDS,
    ConfigError,
    ExporterConfig,
    Listen,
    TargetConfig,
    load_config,
    merge_cli,
    parse_engine_flag,
    redact_url,
)

FULL = """
listen: "127.0.0.1:9999"
interval: 10s
gpu: fake:2
gpu_timeout: 500ms
node_name: gpu-node-7
web_config_file: /etc/llmslo/web.yml
log_level: debug
scrape:
  timeout: 2s
  max_page_bytes: 8MiB
limits:
  max_series_per_target: 5000
  max_lora_adapters_per_target: 16
  max_samples_per_family: 2500
targets:
  - kind: vllm
    url: http://10.0.0.1:8000/metrics
    model: llama-3-8b
    pod: vllm-0
    namespace: llm
  - kind: auto
    url: file:///tmp/page.prom
    name: saved
    timeout: 1.5
    max_page_bytes: 1048576
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exporter.yaml"
    path.write_text(text)
    return path


def test_a_full_file_loads_into_typed_settings(tmp_path):
    cfg = load_config(write(tmp_path, FULL))
    assert cfg.listen == Listen("127.0.0.1", 9999)
    assert (cfg.interval_s, cfg.gpu, cfg.gpu_timeout_s, cfg.node_name) == (10.0, "fake:2", 0.5, "gpu-node-7")
    assert (cfg.timeout_s, cfg.max_page_bytes, cfg.log_level) == (2.0, 8 * 1024 * 1024, "debug")
    assert (cfg.limits.max_series_per_target, cfg.limits.max_lora_adapters_per_target) == (5000, 16)
    assert cfg.limits.max_samples_per_family == 2500
    assert cfg.targets == (
        TargetConfig(kind="vllm", url="http://10.0.0.1:8000/metrics", model="llama-3-8b", pod="vllm-0", namespace="llm"),
        TargetConfig(kind="auto", url="file:///tmp/page.prom", name="saved", timeout_s=1.5, max_page_bytes=1048576),
    )
    assert cfg.target_timeout(cfg.targets[0]) == 2.0 and cfg.target_timeout(cfg.targets[1]) == 1.5
    assert cfg.target_max_bytes(cfg.targets[0]) == 8 * 1024 * 1024


def test_an_empty_file_means_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == ExporterConfig()


@pytest.mark.parametrize("text, where, fix", [
    ("intervall: 5s\n", "intervall: unknown setting", "did you mean 'interval'?"),
    ("interval: soon\n", "interval: 'soon' is not a duration", "use a duration such as 5s"),
    ("interval: -1\n", "interval:", "use a duration"),
    ("listen: 9400\n", "listen: ", "HOST:PORT"),
    ("gpu: nvidia\n", "gpu: 'nvidia' is not a GPU provider", "fake:N"),
    ("targets:\n  - kind: vllm\n    url: http://a/metrics\n  - kind: llama\n    url: http://b/metrics\n",
     "targets[1].kind: unknown engine kind 'llama'", "use one of vllm"),
    ("targets:\n  - kind: vllm\n    url: ftp://a/metrics\n", "targets[0].url:", "http(s)://host:port/metrics"),
    ("targets:\n  - url: http://a/metrics\n", "targets[0].kind: missing", "add `kind:`"),
    ("targets:\n  - kind: vllm\n    url: http://a/\n    timout: 2s\n", "targets[0].timout: unknown setting", "'timeout'"),
    ("targets: {kind: vllm}\n", "targets: expected a list", "- kind:"),
    ("scrape:\n  max_page_bytes: huge\n", "scrape.max_page_bytes:", "16MiB"),
    ("limits:\n  max_series_per_target: 0\n", "limits.max_series_per_target:", "whole number"),
    ("limits:\n  max_samples_per_family: -1\n", "limits.max_samples_per_family:", "whole number"),
    ("kubernetes_discovery:\n  enabled: yes-please\n", "kubernetes_discovery.enabled:", "true or false"),
    ("targets:\n  - kind: vllm\n    url: http://a/m\n  - kind: tgi\n    url: http://a/m\n", "targets[1]: two targets", "name:"),
    ("interval: 5s\ngpu: off\n  listen: x\n", "mapping values are not allowed here", "YAML syntax"),
])
def test_errors_name_the_file_the_field_and_the_fix(tmp_path, text, where, fix):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert re.match(rf"{re.escape(str(path))}:\d+: ", message), message  # file:line, as slogen's spec errors
    assert where in message and "(fix: " in message and fix in message.split("(fix: ", 1)[1], message


def test_every_problem_of_a_file_is_reported_at_once_in_its_order(tmp_path):
    path = write(tmp_path, "interval: 500\ntargets:\n  - kind: vllmm\n    url: ftp://x\n  - name: b\n    url: http://b/m\n"
                           "limits:\n  max_series_per_target: 0\nunknown_key: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert [p.split(": ", 2)[:2] for p in err.value.problems] == [
        [f"{path}:1", "field interval"], [f"{path}:3", "field targets[0].kind"], [f"{path}:4", "field targets[0].url"],
        [f"{path}:5", "field targets[1].kind"], [f"{path}:8", "field limits.max_series_per_target"],
        [f"{path}:9", "field unknown_key"],
    ]
    assert str(err.value) == "\n".join(err.value.problems)


def test_yaml_off_means_gpu_off_and_the_fake_gpu_cap_is_the_gpu_packages(tmp_path):
    assert load_config(write(tmp_path, "gpu: off\n")).gpu == "off"  # YAML 1.1 reads bare off as false
    with pytest.raises(ConfigError, match="gpu: 'fake:100000' is not a GPU provider"):
        load_config(write(tmp_path, "gpu: fake:100000\n"))


def test_a_missing_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "absent.yaml")


def test_discovery_needs_a_node_name(tmp_path, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(ConfigError, match="NODE_NAME"):
        load_config(write(tmp_path, "kubernetes_discovery:\n  enabled: true\n"))
    monkeypatch.setenv("NODE_NAME", "node-a")
    assert load_config(write(tmp_path, "kubernetes_discovery:\n  enabled: true\n")).discovery.enabled


def test_flags_override_the_file_and_engines_add_to_its_targets(tmp_path):
    cfg = merge_cli(load_config(write(tmp_path, FULL)), listen=":9500", engines=["tgi=http://10.0.0.2/metrics"],
                    gpu="off", interval="2", node_name="other")
    assert cfg.listen == Listen("0.0.0.0", 9500) and cfg.gpu == "off" and cfg.interval_s == 2 and cfg.node_name == "other"
    assert [t.kind for t in cfg.targets] == ["vllm", "auto", "tgi"]
    assert cfg.target_timeout(cfg.targets[0]) == 2.0  # 2 s timeout, 2 s interval
    assert merge_cli(cfg, interval="1").target_timeout(cfg.targets[0]) == 1.0  # never longer than the interval


@pytest.mark.parametrize("flag, message", [
    ("vllm", "expected KIND=URL"),
    ("llama=http://a/metrics", "unknown engine kind 'llama'"),
    ("vllm=localhost:8000/metrics", "must start with http://"),
])
def test_bad_engine_flags(flag, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_engine_flag(flag)
    assert str(err.value).startswith(f"--engine {flag!r}")


def test_credentials_in_urls_never_become_labels():
    assert redact_url("http://user:pw@10.0.0.1:8000/metrics") == "http://10.0.0.1:8000/metrics"
    assert TargetConfig(kind="vllm", url="http://user:pw@h:1/m").label == "http://h:1/m"


def test_every_engine_kind_has_an_adapter():
    assert set(ENGINE_KINDS) == set(adapters.ADAPTERS)
