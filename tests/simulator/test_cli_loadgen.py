"""The command lines (`llmslo-sim serve|virtual|presets`, `llmslo-load`) and the load generator as a library."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from exporter.promtext import parse_page
from llmslo.conventions import VLLM as V
from simulator import cli, loadgen
from simulator.faults import FaultState
from simulator.workload import LengthDist, WorkloadSpec, generate

SMALL = WorkloadSpec(rate=25, duration=1.0, prompt_len=LengthDist(120, 0.3, 16, 400),
                     output_len=LengthDist(15, 0.3, 2, 40), shared_prefix=0.5, num_prefixes=2, seed=4)


def test_virtual_cli_prints_the_summary_as_json(capsys):
    assert cli.main(["virtual", "--rate", "5", "--duration", "10", "--json", "--ttft", "0.3", "--tpot", "0.03"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("ttft_s", "tpot_s", "e2e_s", "throughput_rps", "goodput_rps", "goodput_tokens_per_s", "preemptions",
                "peak_kv_usage", "peak_queue", "simulated_requests_per_wall_s"):
        assert key in summary, key
    assert summary["thresholds"] == {"ttft_s": 0.3, "tpot_s": 0.03}
    assert set(summary["ttft_s"]) == {"p50", "p90", "p99", "mean"}
    assert summary["requests"] == summary["completed"] > 20


def test_virtual_cli_text_static_batching_and_lora_mix(capsys, tmp_path):
    out = tmp_path / "metrics.prom"
    assert cli.main(["virtual", "--rate", "4", "--duration", "10", "--batching", "static", "--lora-mix", "a=0.5",
                     "--metrics-out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "goodput" in text and "TTFT" in text and "static" in text
    page = parse_page(out.read_text()).families
    assert page[V.REQUEST_SUCCESS].samples and page[V.LORA_REQUESTS_INFO].samples


def _virtual_json(capsys, *flags: str) -> dict:
    assert cli.main(["virtual", "--rate", "8", "--duration", "10", "--json", *flags]) == 0
    summary = json.loads(capsys.readouterr().out)
    return {k: v for k, v in summary.items() if k not in ("wall_s", "cpu_s", "simulated_requests_per_wall_s")}


def test_virtual_seed_seeds_the_workload(capsys):
    """Issue 25: `--seed` changed only the engine's output words, so every seed ran the same requests."""
    one, again, other = _virtual_json(capsys, "--seed", "1"), _virtual_json(capsys, "--seed", "1"), \
        _virtual_json(capsys, "--seed", "2")
    assert one == again
    assert one != other and (one["requests"], one["ttft_s"]) != (other["requests"], other["ttft_s"])
    assert _virtual_json(capsys, "--seed", "2", "--workload-seed", "1") == one  # --workload-seed still wins


def test_cli_errors_name_the_flag(capsys):
    assert cli.main(["virtual", "--rate", "5", "--duration", "5", "--shared-prefix", "1.5"]) == 2
    assert "--shared-prefix" in capsys.readouterr().err
    assert cli.main(["virtual", "--rate", "5", "--duration", "5", "--slowdown", "0"]) == 2
    assert "slowdown" in capsys.readouterr().err
    assert cli.main(["virtual", "--rate", "5", "--duration", "5", "--lora-mix", "a=2"]) == 2
    assert "--lora-mix" in capsys.readouterr().err


def test_presets_lists_every_deployment(capsys):
    assert cli.main(["presets"]) == 0
    text = capsys.readouterr().out
    assert "llama3-8b-h100" in text and "llama3-70b-h100x4" in text


def test_serve_subprocess_on_an_os_chosen_port_and_load_cli_against_it(capsys):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "serve", "--port", "0", "--max-model-len", "4096", "--lora", "sql"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        assert "serving" in line, line
        url = line.rsplit(" ", 1)[-1].strip()
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            assert resp.status == 200
        code = loadgen.main(["--url", url, "--rate", "20", "--duration", "0.5", "--output-len", "10",
                             "--prompt-len", "50", "--lora-mix", "sql=0.5", "--json"])
        assert code == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["requests"] == summary["completed"] > 0 and summary["failed"] == 0
        assert summary["ttft_s"]["p50"] > 0 and summary["tpot_s"]["p50"] > 0
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            fam = parse_page(resp.read().decode()).families
        finished = sum(s.value for s in fam[V.REQUEST_SUCCESS].samples if s.name.endswith("_total"))
        assert finished == summary["requests"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()


def test_load_cli_reports_an_unreachable_server(capsys):
    assert loadgen.main(["--url", "http://127.0.0.1:9", "--rate", "1", "--duration", "0.1"]) == 1
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.parametrize("chat", [True, False])
def test_run_load_returns_records_the_caller_can_judge(sim_server, chat):
    srv = sim_server()
    records = asyncio.run(loadgen.run_load(srv.url, SMALL, chat=chat))
    items = generate(SMALL)
    assert len(records) == len(items) > 10
    assert all(r.ok and r.error == "" for r in records)
    assert [r.output_tokens for r in records] == [i.output_len for i in items]  # usage counts are exact
    assert all(r.ttft > 0 and r.e2e >= r.ttft for r in records)
    assert all(r.tpot is not None and 0.005 < r.tpot < 0.1 for r in records)
    good = sum(r.good(ttft_slo=0.5, tpot_slo=0.05) for r in records)
    strict = sum(r.good(ttft_slo=0.001, tpot_slo=0.05) for r in records)
    assert good > strict == 0
    summary = loadgen.summary_of(records, 0.5, 0.05)
    assert summary["good_requests"] == good
    # Client-side TTFT includes the engine's: it is never below what the engine measured.
    with urllib.request.urlopen(srv.url + "/metrics", timeout=5) as resp:
        fam = parse_page(resp.read().decode()).families
    engine_ttft = [s.value for s in fam[V.TTFT].samples if s.name.endswith("_sum")][0]
    assert sum(r.ttft for r in records) >= engine_ttft
    hits = [s.value for s in fam[V.PREFIX_CACHE_HITS].samples if s.name.endswith("_total")][0]
    assert hits > 0  # the shared prefixes reached the engine's prefix cache through the text


def test_run_load_counts_failures(sim_server):
    srv = sim_server(faults=FaultState(error_rate=0.5, error_mode="http500"))
    records = asyncio.run(loadgen.run_load(srv.url, SMALL))
    failed = [r for r in records if not r.ok]
    assert 0 < len(failed) < len(records)
    assert {r.error for r in failed} == {"http 500"}
    srv.server.faults.update({"error_mode": "abort"}, 0.0)
    records = asyncio.run(loadgen.run_load(srv.url, SMALL, concurrency_limit=4))
    failed = [r for r in records if not r.ok]
    assert failed and all(r.error.startswith("aborted") for r in failed)
    assert loadgen.summary_of(records, 1.0, 1.0)["failed"] == len(failed)
