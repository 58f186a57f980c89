"""`slogen validate` reads the autoscaling specs as `slogen build` does (issue 29): the same errors, all of them in
one run, in slogen's one format (file:line, field, fix), from the directory `--autoscaling` names or the default
one it says it read."""

from __future__ import annotations

from pathlib import Path

import pytest

from slogen.cli import main
from tests.helpers.specs import one_pool

SLOS = '''version: "prometheus/v1"
service: chat
slos:
  - name: ttft
    objective: 99
    sli: {plugin: {id: llmslo/latency, options: {metric: ttft, threshold: "0.5"}}}
    alerting: {name: ChatTtft}
  - name: tpot
    objective: 99
    sli: {plugin: {id: llmslo/latency, options: {metric: tpot, threshold: "0.05"}}}
    alerting: {name: ChatTpot}
'''


BAD = {
    "no such SLO": one_pool("ttft_burn_rate: {slo: chat/nope, above: 2}"),
    "not a TTFT SLO": one_pool("ttft_burn_rate: {slo: chat/tpot, above: 2}"),
    "a long window": one_pool("ttft_burn_rate: {slo: chat/ttft, above: 2, window: 1h}"),
    "a string number": one_pool('queue_depth: {per_replica: "4"}'),
    "a misspelt trigger": one_pool("queue_dept: {per_replica: 4}"),
    "a percentage for a ratio": one_pool("kv_cache_utilization: {per_replica: 85}"),
    "a kind that cannot scale": one_pool("queue_depth: {per_replica: 4}").replace("{name: d}",
                                                                                           "{kind: CronJob, name: d}"),
    "two pools of one name": one_pool("queue_depth: {per_replica: 4}")
    + one_pool("queue_depth: {per_replica: 4}").split("pools:\n", 1)[1],
    "an SLO spec in autoscaling/": SLOS,
}


def tree(tmp_path: Path, pools: str | None) -> Path:
    slos = tmp_path / "slos"
    slos.mkdir()
    (slos / "chat.yaml").write_text(SLOS)
    if pools is not None:
        (tmp_path / "autoscaling").mkdir()
        (tmp_path / "autoscaling" / "pools.yaml").write_text(pools)
    return slos


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize("case", list(BAD))
def test_validate_refuses_every_autoscaling_error_build_refuses(tmp_path, capsys, case):
    slos = tree(tmp_path, BAD[case])
    assert main(["build", "--out", str(tmp_path / "out"), "--no-promtool-check", "--no-health-alerts",
                 "--no-capacity-rules", str(slos)]) == 1
    refused = errors(capsys.readouterr().err)
    assert refused and all("autoscaling/pools.yaml:" in e and "(fix: " in e for e in refused), refused
    assert main(["validate", str(slos)]) == 1
    assert errors(capsys.readouterr().err) == refused


def test_every_autoscaling_mistake_in_one_run_at_its_own_line(tmp_path, capsys):
    pools = one_pool("queue_dept: {per_replica: 4}\n      ttft_burn_rate: {slo: chat/nope, above: 2}"
                        ).replace("replicas: {max: 4}", "replicas: {max: 0}").replace("name: p", "name: P")
    slos = tree(tmp_path, pools)
    assert main(["validate", str(slos)]) == 1
    path = tmp_path / "autoscaling" / "pools.yaml"
    assert errors(capsys.readouterr().err) == [
        f"error: {path}:3: field pools[0].name: 'P' is not valid (fix: use lowercase letters, digits and '-' "
        "(a Kubernetes name))",
        f"error: {path}:6: field pools[0].replicas.max: expected a whole number at least 1, got 0 (fix: write a "
        "whole number at least 1)",
        f"error: {path}:9: field pools[0].triggers.queue_dept: unknown key (fix: remove it or correct the name "
        "(did you mean 'queue_depth'?))",
        f"error: {path}:10: field pools[0].triggers.ttft_burn_rate.slo: no SLO 'chat/nope' (fix: use "
        "service/slo-name of a defined SLO (defined: chat/tpot, chat/ttft))",
    ], "the SLO a pool names is checked beside the pool's other problems (issue 35)"
    pools = one_pool("queue_depth: {per_replica: 4}\n      ttft_burn_rate: {slo: chat/nope, above: 2}")
    path.write_text(pools)
    assert main(["validate", str(slos)]) == 1
    assert errors(capsys.readouterr().err) == [
        f"error: {path}:10: field pools[0].triggers.ttft_burn_rate.slo: no SLO 'chat/nope' (fix: use "
        "service/slo-name of a defined SLO (defined: chat/tpot, chat/ttft))"]


def test_the_autoscaling_directory_is_said_and_can_be_named(tmp_path, capsys):
    slos = tree(tmp_path, None)
    assert main(["validate", str(slos)]) == 0
    err = capsys.readouterr().err
    assert (f"note: no autoscaling specs: {tmp_path / 'autoscaling'} does not exist (the default: autoscaling/ "
            "beside the first input directory, e.g. ./autoscaling for slos/), so no KEDA or HPA objects are made; "
            "pass --autoscaling DIR to read them elsewhere, or --no-autoscaling to say none are wanted") in err
    elsewhere = tmp_path / "capacity"
    elsewhere.mkdir()
    (elsewhere / "pools.yaml").write_text(BAD["no such SLO"])
    assert main(["validate", "--autoscaling", str(elsewhere), str(slos)]) == 1
    err = capsys.readouterr().err
    assert f"note: autoscaling specs read from {elsewhere} (--autoscaling)" in err
    assert "no SLO 'chat/nope'" in err
    out = tmp_path / "out"
    (elsewhere / "pools.yaml").write_text(one_pool("ttft_burn_rate: {slo: chat/ttft, above: 2}"))
    assert main(["build", "--out", str(out), "--no-promtool-check", "--autoscaling", str(elsewhere), str(slos)]) == 0
    assert "name: p" in (out / "deploy/generated/keda/scaledobjects.yaml").read_text()
    assert f"note: autoscaling specs read from {elsewhere} (--autoscaling)" in capsys.readouterr().err
