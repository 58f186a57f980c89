"""`--workers N`: every tap option reaches the worker processes, whatever its type.

worker_argv is generic over the option list; this checks it by setting every option to a
value other than its default and parsing the worker's command line back.
"""

from __future__ import annotations

import argparse

import pytest

from exporter.tap.options import add_arguments
from exporter.tap.workers import _PER_WORKER, Worker, worker_argv


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return p


def _not_default(action: argparse.Action) -> object:
    """A value for the option that differs from its default and survives str() and parsing back."""
    if isinstance(action, argparse._StoreTrueAction):
        return True
    if action.choices:
        return next(c for c in action.choices if c != action.default)
    if action.nargs in ("+", "*"):
        return ["a.yaml", "b.yaml"]
    if action.type is None:
        return f"value-of-{action.dest}"
    for text in ("7", "12.5", "0.25", "http://127.0.0.1:1"):
        try:
            value = action.type(text)  # type: ignore[misc]
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
        if value != action.default:
            return value
    raise AssertionError(f"no test value for --{action.dest}")


def test_only_the_per_worker_options_are_rewritten() -> None:
    """Options skipped by the generic loop are exactly those each worker gets its own value for: adding an
    option to _PER_WORKER would hide it from the test below, so the set is pinned here."""
    assert _PER_WORKER == {"listen", "metrics_listen", "workers", "reuse_port", "admission_taps"}


def test_every_option_reaches_the_workers() -> None:
    parser = _parser()
    options = [a for a in parser._actions if a.option_strings and a.dest not in _PER_WORKER]
    assert len(options) >= 16  # the tap's options, not an empty list by mistake
    args = parser.parse_args(["--listen", "127.0.0.1:0", "--upstream", "http://x", "--metrics-listen", ":0"])
    for action in options:
        setattr(args, action.dest, _not_default(action))
    args.workers = 3
    argv = worker_argv(args, 8123, Worker(0, "@sock-0"))
    assert argv[1:3] == ["-m", "exporter.tap"]
    back = parser.parse_args(argv[3:])
    for action in options:
        assert getattr(back, action.dest) == getattr(args, action.dest), f"--{action.dest} did not reach the workers"
    assert back.listen == ("127.0.0.1", 8123) and back.reuse_port and back.metrics_listen == "\0sock-0"


def test_each_workers_gate_counts_for_all_the_taps_on_the_engine() -> None:
    """Every worker's gate admits on its own, so it counts its admissions for all of them: --admission-taps is
    the parent's times --workers (and is left out without --admission)."""
    parser = _parser()
    base = ["--listen", "127.0.0.1:0", "--upstream", "http://x", "--metrics-listen", ":0", "--workers", "3"]
    back = parser.parse_args(worker_argv(parser.parse_args([*base, "--admission"]), 1, Worker(0, "@s"))[3:])
    assert back.admission and back.admission_taps == 3
    back = parser.parse_args(worker_argv(parser.parse_args([*base, "--admission", "--admission-taps", "2"]), 1,
                                         Worker(0, "@s"))[3:])
    assert back.admission_taps == 6
    assert "--admission-taps" not in worker_argv(parser.parse_args(base), 1, Worker(0, "@s"))


@pytest.mark.parametrize("flag", ["--trust-slo-headers", "--first-token-timeout", "--max-buffered-body-bytes"])
def test_defaults_are_left_to_the_worker(flag: str) -> None:
    """An option left at its default is not written out (the worker derives the same default)."""
    args = _parser().parse_args(["--listen", ":0", "--upstream", "http://x", "--metrics-listen", ":0"])
    assert flag not in worker_argv(args, 1, Worker(0, "@s"))
