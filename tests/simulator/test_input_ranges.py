"""Every number the simulator's commands take has a range (issue 27): out of it, exit 2 naming the flag and range.

Before, `plan --start-rate 1e12` grew to 21 GB, `--prompt-len 1e9` to 9.8 GB, `--duration 1e9` to 5.8 GB,
`--tolerance 1e-300` never ended and nan or 1e308 printed nonsense. The runs that grew are refused before any
work here, so this table runs in well under a second.
"""

from __future__ import annotations

import argparse
import math
import tracemalloc

import pytest

from llmslo.argtypes import Bound, number_arg
from simulator import cli, limits, loadgen, plan
from simulator.config import EngineConfig
from simulator.workload import LengthDist, WorkloadSpec, generate

SLO = ["--slo", "slos/chat.yaml"]

# (argv, the flag the error must name, a piece of the allowed range it must state)
BAD_FLAGS = [
    (["plan", *SLO, "--start-rate", "1e12"], "--start-rate", "0.01 to 10,000"),
    (["plan", *SLO, "--start-rate", "1e-300"], "--start-rate", "0.01 to 10,000"),
    (["plan", *SLO, "--prompt-len", "1000000000"], "--prompt-len", "1 to 131,072"),
    (["plan", *SLO, "--prompt-len", "1e9"], "--prompt-len", "1 to 131,072"),
    (["plan", *SLO, "--duration", "1e9"], "--duration", "1 to 3,600"),
    (["plan", *SLO, "--tolerance", "1e-300"], "--tolerance", "0.001 to 0.5"),
    (["plan", *SLO, "--rate", "nan"], "--rate", "0.001 to 1,000,000,000"),
    (["plan", *SLO, "--rate", "1e308"], "--rate", "0.001 to 1,000,000,000"),
    (["plan", *SLO, "--objective", "100"], "--objective", "0.1 to 99.999"),
    (["plan", *SLO, "--seeds", "0"], "--seeds", "1 to 20"),
    (["plan", *SLO, "--num-prefixes", "100000"], "--num-prefixes", "1 to 100"),
    (["virtual", "--rate", "nan", "--duration", "5"], "--rate", "0.001 to 100,000, or inf"),
    (["virtual", "--rate", "1e308", "--duration", "5"], "--rate", "0.001 to 100,000, or inf"),
    (["virtual", "--rate", "5", "--duration", "inf"], "--duration", "0.01 to 86,400"),
    (["virtual", "--rate", "5", "--num-requests", "1e7"], "--num-requests", "0 to 1,000,000"),
    (["virtual", "--rate", "5", "--duration", "5", "--output-len", "-3"], "--output-len", "1 to 131,072"),
    (["virtual", "--rate", "5", "--duration", "5", "--prompt-sigma", "nan"], "--prompt-sigma", "0 to 3"),
    (["virtual", "--rate", "5", "--duration", "5", "--num-gpu-blocks", "1000000000"], "--num-gpu-blocks",
     "0 to 2,097,152"),
    (["virtual", "--rate", "5", "--duration", "5", "--max-model-len", "10000000"], "--max-model-len", "0 to 131,072"),
    (["virtual", "--rate", "5", "--duration", "5", "--slowdown", "inf"], "--slowdown", "0.01 to 1,000"),
    (["virtual", "--rate", "5", "--duration", "5", "--stall", "-1"], "--stall", "0 to 86,400, or inf"),
    (["virtual", "--rate", "5", "--duration", "5", "--ttft", "0"], "--ttft", "above 0 and at most 3,600"),
    (["virtual", "--rate", "5", "--duration", "5", "--seed", "-1"], "--seed", "0 to 4,294,967,295"),
    (["serve", "--port", "70000"], "--port", "0 to 65,535"),
]


@pytest.mark.parametrize("argv,flag,allowed", BAD_FLAGS,
                         ids=[f"{a[0]} {f} {a[a.index(f) + 1]}" for a, f, _ in BAD_FLAGS])
def test_a_bad_flag_exits_2_naming_the_flag_and_its_range(capsys, argv, flag, allowed):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and allowed in err, err


@pytest.mark.parametrize("argv,flag,allowed", [
    (["--url", "http://127.0.0.1:9", "--rate", "1", "--duration", "1", "--timeout", "nan"], "--timeout", "0.1 to"),
    (["--url", "http://127.0.0.1:9", "--rate", "1", "--duration", "1", "--concurrency-limit", "-1"],
     "--concurrency-limit", "0 to 100,000"),
    (["--url", "http://127.0.0.1:9", "--rate", "1e308", "--duration", "1"], "--rate", "0.001 to 100,000"),
])
def test_the_load_generator_takes_the_same_ranges(capsys, argv, flag, allowed):
    assert loadgen.main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and allowed in err, err


@pytest.mark.parametrize("argv,words", [
    # rate x duration: each alone in range, together more requests than a run may hold
    (["virtual", "--rate", "1000", "--duration", "3600"], ("--rate 1000 x --duration 3600", "1,000,000")),
    (["plan", *SLO, "--duration", "3600", "--start-rate", "1000"], ("--start-rate", "277.778")),
    # KV blocks that --block-size and --tp derive, each flag alone in range
    (["virtual", "--rate", "1", "--duration", "5", "--tp", "16", "--block-size", "1"],
     ("--num-gpu-blocks", "--block-size 1", "2,097,152")),
    (["virtual", "--rate", "0.001", "--duration", "5"], ("less than one request",)),
])
def test_flags_in_range_that_together_ask_too_much_exit_2(capsys, argv, words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    parser = cli._parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [*subs.choices.items(), ("llmslo-load", loadgen._parser())]


def test_every_number_flag_has_a_bound_shown_in_its_help():
    seen = 0
    for name, parser in _commands():
        for action in parser._actions:
            assert action.type not in (int, float), f"{name} {action.option_strings}: a number without a range"
            if isinstance(action.type, Bound):
                seen += 1
                shown = (action.help or "") % {"default": action.default}  # as --help prints it
                assert action.type.describe() in shown and action.type.why in shown, action.dest
    assert seen >= 40


def test_bound_parses_checks_and_refuses():
    b = Bound(0.5, 10, "why", words=("inf",))
    assert b.parse("2") == 2.0 and b.parse("inf") == float("inf") and b.parse(" 10 ") == 10
    for text in ("nan", "-inf", "0.4", "10.0001", "1e308", "x", ""):
        with pytest.raises(ValueError, match="0.5 to 10"):
            b.parse(text)
    whole = Bound(1, 5, "why", integer=True)
    assert whole.parse("3") == 3 and isinstance(whole.parse("3"), int)
    with pytest.raises(argparse.ArgumentTypeError, match="whole number from 1 to 5"):
        whole("2.5")
    assert whole.check(4, "f") == 4
    for value in (True, "3", None, 2.5, 6, float("nan"), [3]):
        with pytest.raises(ValueError, match="^f: "):
            whole.check(value, "f")
    opened = Bound(0, 1, "why", low_open=True)
    assert not opened.accepts(0) and opened.accepts(1) and "above 0 and at most 1" in opened.describe()


def test_a_run_cannot_ask_for_more_requests_than_the_cap():
    with pytest.raises(ValueError, match="1,000,000"):
        WorkloadSpec(rate=10_000, duration=101)
    spec = WorkloadSpec(rate=1, duration=3600)
    assert plan.rate_cap(spec) == pytest.approx(limits.MAX_REQUESTS / 3600)
    with pytest.raises(ValueError, match="--start-rate"):
        plan.find_max_rate(EngineConfig(), spec, plan.GoodputClass("c", 0.5, 0.05, 95.0), start_rate=1000)


def test_a_generated_prompt_holds_no_list_of_its_tokens():
    """Before: every prompt a list of ~40 bytes a token, so 1M queued requests of 500 tokens held 20 GB."""
    spec = WorkloadSpec(rate=math.inf, num_requests=100, duration=1, prompt_len=LengthDist(8000, 0, 1, 8000),
                        output_len=LengthDist(10, 0, 1, 10), shared_prefix=0.5, num_prefixes=1)
    tracemalloc.start()
    try:
        items = generate(spec, max_model_len=8192)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(items) == 100 and len(items[0].prompt_token_ids) == 8000
    assert peak < 1_000_000, f"{peak:,} bytes for 100 prompts of 8,000 tokens"
    ids = items[0].prompt_token_ids
    as_list = list(ids)
    assert ids == as_list and ids[3990:4010] == as_list[3990:4010] and ids[-1] == as_list[-1]
    assert ids[::7] == as_list[::7] and ids[:4000] == list(items[1].prompt_token_ids)[:4000]  # the shared half



def test_number_arg_says_what_it_takes_for_garbage_and_for_a_number_out_of_range():
    finite = number_arg(float, math.isfinite, "a number", "a finite number; write e.g. 0.95")
    assert finite("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'x' is not a number$"):
        finite("x")
    for text in ("nan", "inf", "-inf"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"is not a finite number; write e\.g\. 0\.95$"):
            finite(text)
    positive = number_arg(int, lambda n: n > 0, "a positive whole number")
    assert positive("3") == 3
    for text in ("0", "-1", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"is not a positive whole number$"):
            positive(text)


def test_the_tap_and_slogen_flags_refuse_a_bad_number_with_exit_2_naming_the_flag(capsys):
    from exporter.tap import options
    from slogen import cli as slogen_cli

    tap = argparse.ArgumentParser()
    options.add_arguments(tap)
    for parser, argv, flag in ((tap, ["--listen", "127.0.0.1:1", "--upstream", "http://x", "--metrics-listen",
                                      "127.0.0.1:2", "--stall-timeout", "inf"], "--stall-timeout"),
                               (tap, ["--listen", "127.0.0.1:1", "--upstream", "http://x", "--metrics-listen",
                                      "127.0.0.1:2", "--workers", "0"], "--workers"),
                               (slogen_cli.parser(), ["build", "slos", "--kv-usage-threshold", "nan"],
                                "--kv-usage-threshold"),
                               (slogen_cli.parser(), ["build", "slos", "--page-min-bad-events", "-1"],
                                "--page-min-bad-events")):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2
        assert f"argument {flag}" in capsys.readouterr().err
