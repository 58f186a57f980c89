"""--sloth-compat reproduces Sloth v0.16's golden outputs (compared as parsed YAML)."""

from __future__ import annotations

import re

import pytest
import yaml

from slogen import VERSION_LABEL, plugins
from slogen.cli import main
from slogen.model import RawSLI
from slogen.plugins.contract import PluginError, SLIPluginRequest


def _integration_test_sli(req: SLIPluginRequest) -> RawSLI:
    """Python twin of Sloth's test SLI plugin `integration_test` (its Go code is not copied; behaviour per PROVENANCE)."""
    for label in ("owner", "tier"):
        if label not in req.labels:
            raise PluginError(f"{label} label is required", label)
    flt, job = req.options["filter"], req.options["job"]
    return RawSLI(
        f'\nsum(rate(integration_test{{ {flt},job="{job}",code=~"(5..|429)" }}[{{{{.window}}}}]))\n/\n'
        f'sum(rate(integration_test{{ {flt},job="{job}" }}[{{{{.window}}}}]))'
    )


def _plugin1(config):
    """Python twin of Sloth's test SLO plugin `integration-tests/plugin1`: merge labels into sloth_slo_info."""
    labels = dict((config or {}).get("labels", {}))

    def apply(slo, rules):
        for rule in rules.meta.rules:
            if rule.record == "sloth_slo_info":
                rule.labels.update(labels)

    return apply


plugins.register_sli_plugin("integration_test", _integration_test_sli)
plugins.register_slo_plugin("integration-tests/plugin1", _plugin1)

CASES = [
    ("in-base.yaml", [], "out-base.yaml.tpl"),
    ("in-base-k8s.yaml", [], "out-base-k8s.yaml.tpl"),
    ("in-base.yaml", ["--disable-alerts"], "out-base-no-alerts.yaml.tpl"),
    ("in-base.yaml", ["--disable-recordings"], "out-base-no-recordings.yaml.tpl"),
    ("in-base.yaml", ["-l", "exk1=exv1", "-l", "exk2=exv2"], "out-base-extra-labels.yaml.tpl"),
    ("in-sli-plugin.yaml", [], "out-sli-plugin.yaml.tpl"),
    ("in-slo-plugin.yaml", [], "out-slo-plugin.yaml.tpl"),
    ("in-slo-plugin-k8s.yaml", [], "out-slo-plugin-k8s.yaml.tpl"),
    ("in-multifile.yaml", [], "out-multifile.yaml.tpl"),
    ("in-multifile-k8s.yaml", [], "out-multifile-k8s.yaml.tpl"),
    ("in-openslo.yaml", [], "out-openslo.yaml.tpl"),
    ("in-base.yaml", ["--default-slo-period", "28d"], "out-base-28d.yaml.tpl"),
    ("in-base.yaml", ["--default-slo-period", "7d", "--slo-period-windows-path", "{windows}"], "out-base-custom-windows-7d.yaml.tpl"),
]


def expected(path, version: str) -> list:
    """Render a Sloth .tpl as its Go test does: {{ .version }} -> version, {{"{{...}}"}} -> {{...}}."""
    text = path.read_text().replace("{{ .version }}", version)
    text = re.sub(r'\{\{"(\{\{[^}]*\}\})"\}\}', r"\1", text)
    return list(yaml.safe_load_all(text))


def version(capsys) -> str:
    assert main(["version"]) == 0
    return capsys.readouterr().out.strip()


@pytest.mark.parametrize("inp,args,out", CASES, ids=[f"{c[0]}{''.join(c[1][:1])}" for c in CASES])
def test_sloth_compat_matches_golden(sloth_testdata, capsys, inp, args, out):
    ver = version(capsys)
    assert ver == VERSION_LABEL
    args = [a.replace("{windows}", str(sloth_testdata.parent / "windows")) for a in args]
    assert main(["generate", "--sloth-compat", "-i", str(sloth_testdata / inp), *args]) == 0
    got = list(yaml.safe_load_all(capsys.readouterr().out))
    assert got == expected(sloth_testdata / out, ver)


def test_invalid_version_fails(sloth_testdata, capsys):
    assert main(["generate", "--sloth-compat", "-i", str(sloth_testdata / "in-invalid-version.yaml")]) == 1
    err = capsys.readouterr().err
    assert "in-invalid-version.yaml:1" in err and "field version" in err and "prometheus/v1" in err


def test_examples_gen_match(sloth_testdata, capsys):
    """Sloth's documentation goldens (examples/_gen, generated with -l cmd=examplesgen.sh, version dev)."""
    examples = sloth_testdata.parents[3] / "examples"
    names = ["getting-started.yml", "home-wifi.yml", "k8s-getting-started.yml", "k8s-home-wifi.yml", "k8s-multifile.yml",
             "kubernetes-apiserver.yml", "multifile.yml", "no-alerts.yml", "raw-home-wifi.yml",
             "openslo-getting-started.yml", "openslo-kubernetes-apiserver.yml"]
    for name in names:
        assert main(["generate", "--sloth-compat", "-l", "cmd=examplesgen.sh", "-i", str(examples / name)]) == 0, name
        got = capsys.readouterr().out.replace(VERSION_LABEL, "dev")
        assert list(yaml.safe_load_all(got)) == list(yaml.safe_load_all((examples / "_gen" / name).read_text())), name
