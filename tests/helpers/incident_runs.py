"""What the stack tests read from one staged incident on a running LocalStack, gathered in one place."""

from __future__ import annotations

import asyncio
import os

from demo import show
from demo.incident import IncidentReport, Scenario, run_incident
from demo.procs import lingering_in_groups, live_children_of
from demo.stack import LocalStack, StackSettings
from llmslo import conventions as C


async def staged_incident(stack: LocalStack, scenario: Scenario) -> dict:
    """Runs the incident, then reads (after the load has drained) goodput, the taps' outcomes, the
    notifications and the page timers."""
    out: dict = {"start_s": stack.timings["start_s"], "rules": stack.rule_files}
    out["report"] = await run_incident(stack, scenario)
    out["good_prom"] = await stack.settled_goodput()
    out["outcomes"] = {r["metric"].get(C.LABEL_OUTCOME, ""): float(r["value"][1]) for r in await stack.prom().query(
        f"sum by ({C.LABEL_OUTCOME}) ({C.TAP_REQUESTS.name})")}
    out["notifications"] = list(stack.webhook.notifications)
    out["engine"] = stack.engine(scenario.slo_class).spec.name
    out["timers"] = stack.page_timers()
    return out


def run_staged_incident(settings: StackSettings, scenario: Scenario, groups: list[int]) -> dict:
    """Starts a LocalStack, stages the incident on it (staged_incident) and stops it; the stack's process
    groups are added to `groups` as soon as they start, so a test can check that none outlives it."""
    out: dict = {}

    async def body() -> None:
        async with LocalStack(settings) as stack:
            groups.extend(stack.sup.process_groups())
            out.update(await staged_incident(stack, scenario))

    asyncio.run(body())
    return out


def timeline(report: IncidentReport) -> str:
    return "\n".join(show.timeline(report.t0, report.events))


def assert_nothing_left(groups: list[int], children_before: set[int]) -> None:
    """Every process group in `groups` is empty, and no child of this process survives but those it had
    before (`children_before`: other tests' business)."""
    assert lingering_in_groups(groups) == []
    assert [c for c in live_children_of(os.getpid()) if c not in children_before] == []
