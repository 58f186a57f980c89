"""The seat arithmetic of exporter.tap.seats on hand-made inputs (the simulator's ground truth is in
test_seats_truth.py)."""

from __future__ import annotations

import math

import pytest

from exporter.tap.seats import MIN_SAMPLES, Distribution, InFlight, Sizes, SizeWindow, committed_tokens, estimate


def test_residual_is_the_mean_remaining_output_given_age_and_cap() -> None:
    d = Distribution.of([(100, 1), (200, 1), (300, 1)])
    assert d.residual(150, None) == pytest.approx(100)  # (200 + 300) / 2 - 150
    assert d.residual(150, 250) == pytest.approx(75)  # (200 + 250) / 2 - 150
    assert d.residual(300, None) == 0  # none longer: about to end
    assert d.ended_by(150, None, 250) == pytest.approx(0.5)
    assert d.ended_by(150, 200, 200) == 1.0  # its cap ends it


def test_exact_sizes_need_enough_requests_and_stay_bounded() -> None:
    w = SizeWindow(capacity=50)
    for i in range(MIN_SAMPLES - 1):
        w.add(100, i)
    assert w.sizes() is None  # too few to trust: the engine's histograms (or the fallback) decide
    for i in range(200):
        w.add(1000, 10 * i)
    assert len(w) == 50
    sizes = w.sizes()
    assert sizes is not None and sizes.source == "tap"
    assert sizes.footprint == 1000 + 10 * 199  # the p99 of 50 is the largest


def test_histogram_sizes_and_an_empty_histogram() -> None:
    prompt = ((100.0, 0.0), (1000.0, 100.0), (math.inf, 100.0))
    output = ((100.0, 50.0), (1000.0, 100.0), (math.inf, 100.0))
    sizes = Sizes.from_histograms(prompt, output)
    assert sizes is not None and sizes.source == "engine"
    assert sizes.footprint == pytest.approx(991 + 982)  # each p99 interpolated in its bucket
    assert Sizes.from_histograms(((1.0, 0.0), (math.inf, 0.0)), output) is None


def test_start_up_commits_every_cap_and_never_reads_above_free_over_footprint() -> None:
    sizes = Sizes.fallback(4096)
    idle = estimate(64_000, 16, [], sizes)
    assert idle.seats == pytest.approx(64_000 / 4096)
    busy = estimate(64_000, 16, [InFlight(10, 2000), InFlight(0, None)], sizes)
    assert busy.committed == (2000 - 10) + 4096 + 4096  # a cap left, and a queued one: its prompt and its output
    assert busy.seats == pytest.approx((64_000 - busy.committed) / 4096)


def test_running_requests_growth_costs_seats_and_ends_give_them_back() -> None:
    sizes = Sizes.from_samples([(100, 900)] * 99 + [(100, 900)])  # every request: 100 in, 900 out
    alone = estimate(100_000, 16, [], sizes)
    assert alone.seats == pytest.approx(100_000 / 1008)  # 1000 tokens in whole blocks of 16
    # 50 running requests that just started will each grow 900 more: room for fewer new ones
    young = estimate(100_000, 16, [InFlight(1, None)] * 50, sizes)
    assert young.seats < alone.seats - 40
    # 50 that are one token from their end free what they hold almost at once: more room than free tokens alone
    old = estimate(100_000, 16, [InFlight(899, None)] * 50, sizes)
    assert old.seats > alone.seats
    assert committed_tokens([InFlight(1, None)] * 50, sizes) == pytest.approx(50 * 899)
