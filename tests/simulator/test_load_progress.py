"""`llmslo-load` says how far a run is, and reads its goodput thresholds from SLO files as `llmslo-sim plan` does
(issue 29: a 30 s run was silent, and its thresholds had to be copied from the SLO by hand)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from simulator import loadgen
from simulator.workload import LengthDist, WorkloadSpec, generate

ROOT = Path(__file__).resolve().parents[2]
SPEC = WorkloadSpec(rate=20, duration=1.5, prompt_len=LengthDist(60, 0.3, 16, 200),
                    output_len=LengthDist(12, 0.3, 2, 30), seed=7)
LINE = re.compile(r"^llmslo-load: \d+ s: (\d+)/(\d+) sent, (\d+) done \((\d+) failed\), (\d+) in flight$")


def test_a_run_longer_than_the_interval_reports_progress(sim_server):
    srv = sim_server()
    said: list[str] = []
    records = asyncio.run(loadgen.run_load(srv.url, SPEC, progress=said.append, progress_every_s=0.3))
    total = len(generate(SPEC))
    assert len(records) == total and said, "a 1.5 s run with a 0.3 s interval says where it is"
    parsed = [LINE.match(line) for line in said]
    assert all(parsed), said
    sent = [int(m.group(1)) for m in parsed]
    assert sent == sorted(sent) and all(int(m.group(2)) == total for m in parsed)
    assert all(int(m.group(3)) <= int(m.group(1)) for m in parsed)


def test_a_short_run_says_nothing(sim_server):
    srv = sim_server()
    said: list[str] = []
    asyncio.run(loadgen.run_load(srv.url, SPEC, progress=said.append, progress_every_s=60))
    assert said == []


def test_load_reads_the_goodput_class_from_an_slo_file(sim_server, capsys):
    srv = sim_server()
    code = loadgen.main(["--url", srv.url, "--rate", "20", "--duration", "0.3", "--output-len", "8",
                         "--prompt-len", "40", "--slo", str(ROOT / "slos" / "chat.yaml"), "--class", "interactive",
                         "--json", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["thresholds"] == {"ttft_s": 0.5, "tpot_s": 0.05}
    assert "goodput class 'interactive'" in out.err and "ttft 0.5 s, tpot 0.05 s" in out.err


def test_load_slo_errors_name_the_flag(capsys, tmp_path):
    assert loadgen.main(["--url", "http://127.0.0.1:9", "--rate", "1", "--duration", "0.1", "--class", "x"]) == 2
    assert "--class needs --slo" in capsys.readouterr().err
    bad = tmp_path / "slo.yaml"
    bad.write_text('version: "prometheus/v1"\nservice: s\nslos:\n  - name: g\n    objective: 95\n    sli: {plugin: '
                   '{id: llmslo/goodput, options: {slo_class: c, ttft: "500"}}}\n')
    assert loadgen.main(["--url", "http://127.0.0.1:9", "--rate", "1", "--duration", "0.1", "--slo", str(bad)]) == 2
    assert "500 looks like milliseconds: write 0.5" in capsys.readouterr().err
