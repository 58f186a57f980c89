"""Per-request objectives from a trusted gateway (llm-d's x-slo-ttft-ms / x-slo-tpot-ms): ignored unless trusted,
bounded, snapped down to the ladder, folded into a bounded set of derived classes, and counted when not taken."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from exporter.tap import policy
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.exposition import PageRenderer
from exporter.tap.gate_state import GateSettings, GateState
from exporter.tap.http1 import RequestHead
from exporter.tap.metrics import TapMetrics
from exporter.tap.objectives import (
    MAX_DERIVED_CLASSES,
    NOTHING,
    TPOT_LADDER,
    TTFT_LADDER,
    Asked,
    DerivedClasses,
    Objective,
    read_asked,
)
from exporter.tap.options import add_arguments
from exporter.tap.settings import TapSettings
from llmslo import conventions as C
from llmslo.ranges import RANGES

CHAT_CLASS = SloClass("chat", 0.5, 0.05, ("chat-*",))
SLO = SloConfig((CHAT_CLASS, SloClass("batch", 10.0, 1.0, ("batch-*",))), {})
PLAIN = TapSettings("http://engine:8000")
TRUSTED = TapSettings("http://engine:8000", trust_slo_headers=True)
FORGED = [(b"X-SLO-Class", b"batch"), (b"x-slo-ttft-ms", b"60000"), (b"x-slo-tpot-ms", b"2000")]


def plan(fields: list[tuple[bytes, bytes]], settings: TapSettings = TRUSTED, slo: SloConfig = SLO,
         model: bytes = b"chat-a") -> policy.Plan:
    head = RequestHead(b"POST", b"/v1/chat/completions", b"1.1", fields)
    fwd = policy.forward(head, b'{"model":"%s"}' % model, True, slo, settings, b"", b"engine:8000")
    assert fwd.plan is not None
    return fwd.plan


def config() -> SloConfig:
    return SloConfig(SLO.classes, {})  # a fresh derived-class registry


# -- not trusted: nothing changes ------------------------------------------------------------------------------
def test_without_the_flag_forged_headers_change_nothing() -> None:
    clean, forged = plan([], PLAIN), plan(FORGED, PLAIN)
    assert forged == clean
    assert forged.objective == Objective("chat", 0.5, 0.05) and forged.objective.ignored == ()
    assert policy.slo_headers(RequestHead(b"POST", b"/", b"1.1", FORGED), trusted=False) is NOTHING
    # Not even counted as ignored: the page of a tap that is not trusting is the same with or without them.
    bad = [(b"x-slo-ttft-ms", b"nan"), (b"x-slo-ttft-ms", b"1"), (b"x-slo-class", b"nope")]
    assert plan(bad, PLAIN).objective.ignored == ()


def test_the_flag_and_its_old_spelling_set_the_same_setting() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    base = ["--listen", "127.0.0.1:1", "--upstream", "http://e", "--metrics-listen", "127.0.0.1:2"]
    assert p.parse_args([*base, "--trusted-gateway-objectives"]).trust_slo_headers is True
    assert p.parse_args([*base, "--trust-slo-headers"]).trust_slo_headers is True
    assert p.parse_args(base).trust_slo_headers is False


# -- trusted: bounds ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "reasons"), [
    ([(b"x-slo-ttft-ms", b"9" * 40)], ("too_long",)),
    ([(b"x-slo-ttft-ms", b"fast")], ("malformed",)),
    ([(b"x-slo-ttft-ms", b"nan")], ("malformed",)),
    ([(b"x-slo-ttft-ms", b"inf")], ("malformed",)),
    ([(b"x-slo-ttft-ms", b"-inf")], ("malformed",)),
    ([(b"x-slo-ttft-ms", b"1e999")], ("malformed",)),  # a finite-looking text that overflows
    ([(b"x-slo-ttft-ms", b"1_000")], ("malformed",)),  # Python's float() would take it; no gateway writes it
    ([(b"x-slo-ttft-ms", b"0x10")], ("malformed",)),
    ([(b"x-slo-ttft-ms", b"")], ("malformed",)),
    ([(b"x-slo-ttft-ms", b"500, 600")], ("malformed",)),  # two values joined by a proxy
    ([(b"x-slo-ttft-ms", b"-5")], ("out_of_range",)),
    ([(b"x-slo-ttft-ms", b"0")], ("out_of_range",)),
    ([(b"x-slo-ttft-ms", b"5")], ("out_of_range",)),  # 5 ms: under RANGES["ttft"].lo
    ([(b"x-slo-ttft-ms", b"60001")], ("out_of_range",)),  # over a minute
    ([(b"x-slo-tpot-ms", b"2001")], ("out_of_range",)),
    ([(b"x-slo-tpot-ms", b"0.5")], ("out_of_range",)),
    ([(b"x-slo-ttft-ms", b"200"), (b"X-Slo-Ttft-Ms", b"200")], ("repeated",)),
    ([(b"x-slo-class", b"batch"), (b"x-slo-class", b"batch")], ("repeated",)),
    ([(b"x-slo-class", b"b" * 300)], ("too_long",)),
    ([(b"x-slo-class", b"platinum")], ("unknown_class",)),
    ([(b"x-slo-class", b"platinum"), (b"x-slo-ttft-ms", b"nan"), (b"x-slo-tpot-ms", b"-1")],
     ("malformed", "out_of_range", "unknown_class")),
])
def test_a_bad_header_is_ignored_and_counted_and_the_class_keeps_its_objectives(
        fields: list[tuple[bytes, bytes]], reasons: tuple[str, ...]) -> None:
    objective = plan(fields, slo=config()).objective
    assert (objective.slo_class, objective.ttft, objective.tpot) == ("chat", 0.5, 0.05)
    assert sorted(objective.ignored) == sorted(reasons)
    assert set(objective.ignored) <= set(C.SLO_HEADER_REASONS)


def test_hostile_header_values_never_raise() -> None:
    rng = random.Random(37)
    alphabet = b"0123456789.eE+-_ xnaifINF\t,\x00\xff"
    for _ in range(3000):
        value = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        name = rng.choice([b"x-slo-ttft-ms", b"x-slo-tpot-ms", b"x-slo-class"])
        objective = plan([(name, value)], slo=config()).objective
        assert objective.base_class == "chat"
        for got, r in ((objective.ttft, RANGES["ttft"]), (objective.tpot, RANGES["tpot"])):
            assert got is not None and r.lo <= got <= r.hi


def test_the_range_ends_are_taken_exactly() -> None:
    assert read_asked([("x-slo-ttft-ms", "10"), ("x-slo-tpot-ms", "2000")]) == Asked("", 0.01, 2.0)
    assert read_asked([("x-slo-ttft-ms", " 60000 ")]) == Asked("", 60.0, None)


# -- snapped down: never looser than asked, at most one ladder step stricter ------------------------------------
def test_the_ladders_cover_the_plausible_ranges_in_steps_of_at_most_a_third() -> None:
    for ladder, r in ((TTFT_LADDER, RANGES["ttft"]), (TPOT_LADDER, RANGES["tpot"])):
        assert ladder[0] == r.lo and ladder[-1] == r.hi and list(ladder) == sorted(set(ladder))
        assert max(b / a for a, b in zip(ladder, ladder[1:], strict=False)) <= 4 / 3 + 1e-9


def test_snapping_holds_a_request_to_at_least_as_strict_an_objective_as_it_asked() -> None:
    rng = random.Random(3)
    derived = DerivedClasses(cap=10**6)
    for _ in range(2000):
        ttft_ms, tpot_ms = rng.uniform(10, 60000), rng.uniform(1, 2000)
        asked = read_asked([("x-slo-ttft-ms", f"{ttft_ms:.3f}"), ("x-slo-tpot-ms", f"{tpot_ms:.3f}")])
        assert asked.ttft is not None and asked.tpot is not None
        o = derived.fold("chat", 0.5, 0.05, asked, (), ())
        assert o.ttft is not None and o.tpot is not None
        assert o.ttft <= asked.ttft and o.tpot <= asked.tpot, "never looser than asked"
        assert o.ttft >= asked.ttft * 0.75 - 1e-12 and o.tpot >= asked.tpot * 0.75 - 1e-12, "one step at most"
        assert o.ttft in TTFT_LADDER and o.tpot in TPOT_LADDER


@pytest.mark.parametrize(("ttft", "tpot", "expect"), [
    (b"450", None, ("chat@ttft400-tpot50", 0.4, 0.05)),  # the class's TPOT, named so the name says it all
    (b"500", b"50", ("chat", 0.5, 0.05)),  # the class's own objectives: no derived class
    (b"520", b"55", ("chat", 0.5, 0.05)),  # snapped onto them
    (None, b"20", ("chat@ttft500-tpot20", 0.5, 0.02)),
    (b"2500", b"100", ("chat@ttft2500-tpot100", 2.5, 0.1)),  # looser than the class: the gateway is trusted
])
def test_header_objectives_fold_into_a_derived_class(ttft: bytes | None, tpot: bytes | None,
                                                     expect: tuple[str, float, float]) -> None:
    fields = [(k, v) for k, v in ((b"x-slo-ttft-ms", ttft), (b"x-slo-tpot-ms", tpot)) if v is not None]
    o = plan(fields, slo=config()).objective
    assert (o.slo_class, o.ttft, o.tpot) == expect and o.ignored == () and o.base_class == "chat"


def test_the_class_header_and_objective_headers_together() -> None:
    o = plan([(b"x-slo-class", b"batch"), (b"x-slo-ttft-ms", b"3000")], slo=config()).objective
    assert (o.slo_class, o.ttft, o.tpot, o.base_class) == ("batch@ttft3000-tpot1000", 3.0, 1.0, "batch")


# -- the cap ------------------------------------------------------------------------------------------------------
def test_past_the_cap_a_request_keeps_its_objectives_under_the_class_overflow_label() -> None:
    slo = config()
    edges = [e for e in TTFT_LADDER if e != 0.5]
    names = set()
    for edge in edges[:MAX_DERIVED_CLASSES]:
        o = plan([(b"x-slo-ttft-ms", b"%g" % (edge * 1000))], slo=slo).objective
        assert o.ttft == edge and o.ignored == ()
        names.add(o.slo_class)
    assert len(names) == MAX_DERIVED_CLASSES
    over = plan([(b"x-slo-ttft-ms", b"%g" % (edges[MAX_DERIVED_CLASSES] * 1000))], slo=slo).objective
    assert (over.slo_class, over.ttft, over.ignored) == ("chat@other", edges[MAX_DERIVED_CLASSES], ("class_cap",))
    again = plan([(b"x-slo-ttft-ms", b"%g" % (edges[0] * 1000))], slo=slo).objective
    assert again.slo_class in names and again.ignored == (), "a name handed out before is still used"


def test_a_derived_name_never_takes_a_configured_class_name() -> None:
    slo = SloConfig((CHAT_CLASS, SloClass("chat@ttft400-tpot50", 9.0, 9.0)), {})
    o = plan([(b"x-slo-ttft-ms", b"400")], slo=slo).objective
    assert (o.slo_class, o.ttft, o.ignored) == ("chat@other", 0.4, ("class_cap",))


def test_the_derived_classes_are_kept_across_a_reload(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=config(), trust_slo_headers=True) as st:
            proxy = st.server.proxy
            before = proxy.slo.derived
            proxy.set_slo(config())
            assert proxy.slo.derived is before

    asyncio.run(go())


# -- counted, and the admission gate sheds by the configured class -----------------------------------------------
def test_the_ignored_headers_counter_has_every_reason_from_the_start_and_refuses_others() -> None:
    m = TapMetrics(SLO)
    page = PageRenderer(m).render_now().decode()
    for reason in C.SLO_HEADER_REASONS:
        assert f'{C.TAP_SLO_HEADERS_IGNORED.name}{{reason="{reason}"}} 0\n' in page
    m.slo_headers_ignored(("malformed", "malformed", "class_cap"))
    page = PageRenderer(m).render_now().decode()
    assert f'{C.TAP_SLO_HEADERS_IGNORED.name}{{reason="malformed"}} 2\n' in page
    assert f'{C.TAP_SLO_HEADERS_IGNORED.name}{{reason="class_cap"}} 1\n' in page
    with pytest.raises(ValueError, match="SLO_HEADER_REASONS"):
        m.slo_headers_ignored(("nope",))


def test_a_derived_class_of_a_sheddable_class_is_shed_as_its_class() -> None:
    state = GateState(GateSettings(sheddable=frozenset({"batch"})), SLO)
    derived = plan([(b"x-slo-class", b"batch"), (b"x-slo-ttft-ms", b"3000")], slo=config()).objective
    assert state.policy(derived, SLO).sheddable
    assert not state.policy(plan([(b"x-slo-ttft-ms", b"3000")], slo=config()).objective, SLO).sheddable


# -- through the real tap ------------------------------------------------------------------------------------------
async def _post(url: str, **headers: str) -> None:
    body = json.dumps({"model": "chat-a", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=headers) as r:
        assert r.status == 200
        await r.read()


async def _requests(stack: Callable, trusted: bool) -> tuple[dict[str, Any], float, dict[str, float]]:
    """Three llm-d style requests through a real tap whose engine takes 150 ms to the first token (the class's
    TTFT objective is 80 ms): one asking for a 1 s TTFT, one for 100 ms, one with a value out of range."""
    slo = SloConfig((SloClass("chat", 0.08, 0.05, ("chat-*",)),), {})
    async with stack(slo=slo, trust_slo_headers=trusted) as st:
        url = st.tap_url + "/v1/chat/completions"
        slow = {"x-test-first-ms": "150", "x-test-delay-ms": "2"}
        await _post(url, **{"x-request-id": "loose", "x-slo-ttft-ms": "1000", "x-slo-tpot-ms": "50", **slow})
        await _post(url, **{"x-request-id": "tight", "x-slo-ttft-ms": "100", "x-slo-tpot-ms": "50", **slow})
        await _post(url, **{"x-request-id": "forged", "x-slo-ttft-ms": "1e12", **slow})
        ignored = st.value(C.TAP_SLO_HEADERS_IGNORED.name, reason="out_of_range")
        good = {cls: st.value(C.GOODPUT_REQUESTS.name, slo_class=cls)
                for cls in ("chat", "chat@ttft1000-tpot50", "chat@ttft100-tpot50")}
        return {r.request_id: (r.slo_class, r.objective.ttft, r.good) for r in st.records}, ignored, good


def test_a_trusted_gateways_request_is_held_to_its_header_objectives(stack: Callable) -> None:
    by_id, ignored, good = asyncio.run(_requests(stack, True))
    assert by_id == {"loose": ("chat@ttft1000-tpot50", 1.0, True), "tight": ("chat@ttft100-tpot50", 0.1, False),
                     "forged": ("chat", 0.08, False)}
    assert ignored == 1
    assert good == {"chat": 0, "chat@ttft1000-tpot50": 1, "chat@ttft100-tpot50": 0}


def test_an_untrusted_request_is_held_to_its_class_whatever_its_headers_say(stack: Callable) -> None:
    by_id, ignored, good = asyncio.run(_requests(stack, False))
    assert by_id == {k: ("chat", 0.08, False) for k in ("loose", "tight", "forged")}
    assert ignored == 0
    assert good == {"chat": 0, "chat@ttft1000-tpot50": 0, "chat@ttft100-tpot50": 0}
