"""Replaying a published benchmark setting: exact request counts, all at once, ShareGPT-like lengths with vLLM's
filter, an offline mode, and V0's scheduling knobs (whole-prompt steps, multi-step blocks)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from simulator import cli, cliargs
from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.costmodel import CostParams
from simulator.engine import EngineCore
from simulator.virtual import simulate
from simulator.workload import DATASETS, LengthDist, WorkloadSpec, generate

FIXED = WorkloadSpec(rate=math.inf, duration=1.0, num_requests=40, prompt_len=LengthDist(300, 0),
                     output_len=LengthDist(20, 0))


def test_an_exact_count_all_at_once_or_poisson():
    at_once = generate(FIXED)
    assert len(at_once) == 40 and {i.arrival for i in at_once} == {0.0}
    poisson = generate(WorkloadSpec(rate=2.0, duration=1.0, num_requests=30, seed=3))
    assert len(poisson) == 30 and poisson[-1].arrival > 1.0  # the count, not the duration, ends arrivals
    with pytest.raises(ValueError, match="--num-requests"):
        WorkloadSpec(rate=math.inf, duration=10)


def test_sharegpt_lengths_pass_vllms_filter_with_its_means():
    d = DATASETS["sharegpt"]
    items = generate(WorkloadSpec(rate=math.inf, duration=1, num_requests=4000, prompt_len=d.prompt_len,
                                  output_len=d.output_len, max_prompt_len=d.max_prompt_len,
                                  max_total_len=d.max_total_len))
    prompts, outputs = [len(i.prompt_token_ids) for i in items], [i.output_len for i in items]
    assert max(prompts) <= 1024 and max(p + o for p, o in zip(prompts, outputs, strict=True)) <= 2048
    assert min(prompts) >= 4 and min(outputs) >= 4
    assert 185 <= statistics.mean(prompts) <= 220 and 165 <= statistics.mean(outputs) <= 195


def test_an_unsatisfiable_filter_is_refused():
    spec = WorkloadSpec(rate=math.inf, duration=1, num_requests=1, prompt_len=LengthDist(5000, 0, 1, 8000),
                        max_prompt_len=100)
    with pytest.raises(ValueError, match="--max-prompt-len"):
        generate(spec)


def test_one_cli_command_replays_a_published_setting(capsys):
    argv = ["virtual", "--rate", "inf", "--num-prompts", "60", "--dataset", "sharegpt", "--offline", "--json",
            "--no-chunked-prefill", "--max-num-batched-tokens", "8192", "--num-scheduler-steps", "10"]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == summary["completed"] == 60


def test_cli_refuses_mixed_up_workload_flags(capsys):
    assert cli.main(["virtual", "--rate", "inf", "--duration", "5"]) == 2
    assert "--num-requests" in capsys.readouterr().err
    assert cli.main(["virtual", "--rate", "5", "--duration", "5", "--num-requests", "9"]) == 2
    assert "give one" in capsys.readouterr().err
    assert cli.main(["virtual", "--rate", "5", "--num-requests", "9", "--dataset", "sharegpt", "--prompt-len", "9"]) == 2
    assert "--dataset sharegpt sets the lengths" in capsys.readouterr().err
    assert cli.main(["virtual", "--rate", "5"]) == 2
    assert "--duration" in capsys.readouterr().err


def test_offline_mode_drops_the_frontend_latency(capsys):
    base = ["virtual", "--rate", "inf", "--num-requests", "1", "--prompt-len", "100", "--prompt-sigma", "0",
            "--output-len", "5", "--output-sigma", "0", "--json"]
    cli.main(base)
    online = json.loads(capsys.readouterr().out)["ttft_s"]["mean"]
    cli.main([*base, "--offline"])
    offline = json.loads(capsys.readouterr().out)["ttft_s"]["mean"]
    assert online - offline == pytest.approx(0.035, abs=1e-9)


def test_v0_steps_run_whole_prompts_without_decodes():
    config = EngineConfig(chunked_prefill=False, max_num_batched_tokens=1000, max_model_len=4096)
    core = EngineCore(config, VirtualClock())
    for i in range(3):
        core.scheduler.add(core.new_request(list(range(i * 1000, i * 1000 + 400)), 5, output_len=5))
    first = core.scheduler.schedule(0.0)  # two whole 400-token prompts fit the 1000-token budget, not three
    assert [n for _, n in first.entries] == [400, 400]
    core.scheduler.update(first, 0.01)
    second = core.scheduler.schedule(0.01)  # the third prompt's step: the two running requests wait
    assert [n for _, n in second.entries] == [400]
    core.scheduler.update(second, 0.02)
    third = core.scheduler.schedule(0.02)
    assert [n for _, n in third.entries] == [1, 1, 1]


def test_multi_step_admits_new_requests_only_at_block_starts():
    config = EngineConfig(num_scheduler_steps=4, max_model_len=4096)
    core = EngineCore(config, VirtualClock())
    core.scheduler.add(core.new_request(list(range(50)), 50, output_len=50))
    admitted_at = []
    for step in range(12):
        if step == 1:  # arrives just after the first block began
            core.scheduler.add(core.new_request(list(range(1000, 1050)), 50, output_len=50))
        s = core.scheduler.schedule(step * 0.01)
        if any(n > 1 for _, n in s.entries):
            admitted_at.append(step)
        core.scheduler.update(s, step * 0.01 + 0.01)
    assert admitted_at == [0, 4]


def test_multi_step_raises_ttft_under_load_and_v1_defaults_are_unchanged():
    spec = WorkloadSpec(rate=20, duration=5, prompt_len=LengthDist(300, 0.3), output_len=LengthDist(60, 0.3), seed=2)
    v1 = simulate(EngineConfig(), spec).summary["ttft_s"]["mean"]
    multi = simulate(EngineConfig(num_scheduler_steps=10), spec).summary["ttft_s"]["mean"]
    assert multi > v1 + 0.02



def test_v0_seats_decide_ttft_past_saturation():
    """V0 admits prompts before decoding: with a seat for every prompt all of them are prefilled first, so TTFT
    does not depend on the output length; with fewer seats the rest wait for sequences to finish decoding. This is
    why the vLLM v0.6.0 blog rows are replayed with its max_num_seqs 512 (bench/fidelity.py)."""
    def ttft(seats: int, output: int) -> float:
        config = EngineConfig(chunked_prefill=False, max_num_batched_tokens=8192, num_scheduler_steps=10,
                              max_num_seqs=seats)
        spec = WorkloadSpec(rate=math.inf, duration=1.0, num_requests=48, prompt_len=LengthDist(462, 0),
                            output_len=LengthDist(output, 0))
        return simulate(config, spec).summary["ttft_s"]["mean"]

    assert ttft(64, 16) == pytest.approx(ttft(64, 128), rel=1e-9)
    assert ttft(24, 128) > 2 * ttft(64, 128)


def test_v0_async_output_processing_hands_a_step_over_when_the_next_one_ends():
    """vLLM 0.6.0 processed step n's outputs while step n+1 ran (PRs 7049/7921/8050): a token reaches the client
    when the next step ends, or at once when nothing runs next. Two requests at once, V0 whole-prompt steps and
    3 output tokens each: one prompt step, then two decode steps, then nothing."""
    class Steps:
        def __init__(self) -> None:
            self.durations: list[float] = []

        def on_step(self, core, stats) -> None:
            self.durations.append(stats.duration)

        def on_finished(self, req) -> None:
            pass

    def run(async_out: bool):
        config = EngineConfig(chunked_prefill=False, max_num_batched_tokens=8192, async_output_proc=async_out)
        spec = WorkloadSpec(rate=math.inf, duration=1.0, num_requests=2, prompt_len=LengthDist(100, 0),
                            output_len=LengthDist(3, 0))
        steps = Steps()
        return simulate(config, spec, observers=(steps,)).summary, steps.durations

    (sync, steps), (late, late_steps) = run(False), run(True)
    assert late_steps == steps and len(steps) == 3  # the schedule is the same; only the hand-over moves
    frontend = CostParams().frontend_latency_s
    assert sync["ttft_s"]["mean"] == pytest.approx(frontend + steps[0], rel=1e-9)
    assert late["ttft_s"]["mean"] == pytest.approx(frontend + steps[0] + steps[1], rel=1e-9)
    # nothing runs after the last token's step, so it is handed over at once: E2E is unchanged
    assert late["e2e_s"]["mean"] == pytest.approx(sync["e2e_s"]["mean"], rel=1e-9)
    assert late["e2e_s"]["mean"] == pytest.approx(frontend + sum(steps), rel=1e-9)
    assert EngineConfig().async_output_proc is False  # V1, the default, hands tokens over as the step ends
    args = cli._parser().parse_args(["virtual", "--rate", "1", "--async-output-proc"])
    assert cliargs.engine_config(args).async_output_proc
