"""`python -m demo.fullstack`: the whole stack on this machine, a staged incident, the page, the all-clear.

    slogen build (compressed alert windows) -> simulator engines (2 models, one with LoRA adapters),
    or with `--engine vllm` a real vLLM (CPU build, tiny model) -> a goodput tap in front of each -> the node exporter (fake GPUs) -> Prometheus (generated rules)
    -> Alertmanager (generated routing) -> a webhook receiver standing in for on-call

It drives steady load, slows the interactive pool down (the simulator through its fault API; the real
engine by throttling its engine processes, so it really runs 30x slower) until its TTFT budget burns fast enough to page,
recovers it, and waits for the page's all-clear. It prints live figures from Prometheus, every notification
as on-call gets it (with its runbook and dashboard links), what Alertmanager held back, a timeline and
`on-call notifications: N page, M ticket`; it exits 0 when the page fired and cleared, and always stops
everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from demo import show
from demo.alertmanager import PAGE_ROUTE, TICKET_ROUTE
from demo.incident import (
    IncidentReport,
    LoadDriver,
    Scenario,
    expected_fire_bound,
    fastest_page_tier,
    find_ttft_slo,
    run_incident,
    sent_between,
)
from demo.procs import StartError
from demo.stack import DEFAULT_SLOS, VLLM, VLLM_ENGINES, VLLM_FAULT, VLLM_SLOS, LocalStack, StackSettings
from llmslo import conventions as C


def _settings(args: argparse.Namespace) -> tuple[StackSettings, Scenario, float]:
    base = StackSettings.fast() if args.fast else StackSettings()
    default_slos = VLLM_SLOS if args.engine == VLLM else (DEFAULT_SLOS,)
    settings = replace(base, slo_paths=tuple(Path(p) for p in args.slo) or default_slos,
                       workdir=Path(args.workdir) if args.workdir else None, keep_workdir=bool(args.workdir))
    steady = args.steady if args.steady is not None else (10.0 if args.fast else 20.0)
    scenario = Scenario(steady_s=steady, min_incident_s=0.0 if args.fast else 10.0,
                        max_incident_s=args.max_wait, max_resolve_s=args.max_wait)
    if args.engine == VLLM:
        settings, scenario = vllm_variant(settings, scenario)
    tick = 3.0 if args.fast else 5.0
    return settings, scenario, tick


def vllm_variant(settings: StackSettings, scenario: Scenario) -> tuple[StackSettings, Scenario]:
    """The same stack and story on a real vLLM: its engines where the simulators go, its real fault."""
    return replace(settings, engines=VLLM_ENGINES, gpus=1), replace(scenario, fault=dict(VLLM_FAULT))


def _what_starts(settings: StackSettings) -> str:
    real = sum(1 for e in settings.engines if e.engine == VLLM)
    sims = len(settings.engines) - real
    kinds = ([f"{sims} simulated engine{'s' if sims != 1 else ''}"] if sims else []) + (
        [f"{real} real vLLM engine{'s' if real != 1 else ''} (CPU build, tiny model; 30-60 s to start)"] if real else [])
    n = len(settings.engines)
    return f"{', '.join(kinds)}, {n} goodput tap{'s' if n != 1 else ''}"


async def _run(args: argparse.Namespace) -> int:
    settings, scenario, tick = _settings(args)
    print(f"llmslo demo: starting slogen, {_what_starts(settings)}, the exporter, Prometheus, "
          "Alertmanager ...", flush=True)
    async with LocalStack(settings) as stack:
        print(f"stack up in {stack.timings['start_s']:.1f}s (work dir {stack.workdir}):")
        for name, url in stack.urls().items():
            print(f"  {name:<24} {url}")
        print(f"  rules: {', '.join(p.name for p in stack.rule_files)}")
        print(f"  notifications are appended to {stack.webhook.log_path}\n", flush=True)
        window = f"{int(10 * settings.prometheus.scrape_interval_s)}s"  # enough scrapes for a steady rate
        held: dict[str, dict] = {}  # alerts Alertmanager inhibited, by fingerprint
        t0 = time.time()
        last_tick = [0.0]
        seen = [0]

        async def on_tick(phase: str) -> None:
            notes = stack.webhook.notifications
            for note in notes[seen[0]:]:
                print("\n".join(show.render_notification(t0, note)), flush=True)
            seen[0] = len(notes)
            if time.monotonic() - last_tick[0] >= tick:
                last_tick[0] = time.monotonic()
                for line in await _note_held_back(stack, t0, held):
                    print(line, flush=True)
                try:
                    status = await show.read_status(stack.prom(), window)
                except Exception as e:  # a slow query must not stop the demo
                    print(f"[{time.time() - t0:6.1f}s] (Prometheus query failed: {e})")
                    return
                print("\n".join(show.render_status(time.time() - t0, phase, status)), flush=True)

        slo = find_ttft_slo(settings.slo_paths, scenario.slo_class)
        tier = scenario.page_tier or fastest_page_tier(settings)
        timers = stack.page_timers()
        bound = expected_fire_bound(settings, timers, slo, tier, bad_share=1.0, completion_lag_s=0.0)
        print(f"incident plan: {scenario.steady_s:.0f}s steady load, then {_fault_text(stack, scenario)} on the "
              f"{scenario.slo_class} pool; SLO {slo.service}/{slo.name} ({slo.objective}% of requests with "
              f"TTFT <= {slo.threshold_s}s) should page ({tier}) within ~{bound:.0f}s plus the slowed requests' latency.")
        print(f"on-call: slogen's alerts/alertmanager.yaml, its receivers posting to the webhook; pages grouped per "
              f"service and cluster (group_wait {timers.group_wait_s:g}s, group_interval {timers.group_interval_s:g}s), "
              f"a page silences its service's tickets.\n", flush=True)
        report = await run_incident(stack, scenario, on_tick)
        await on_tick("done")
        remaining = args.duration - (time.time() - t0)
        if remaining > 0:
            print(f"\nsteady load for {remaining:.0f}s more (--duration {args.duration:.0f})", flush=True)
            driver = LoadDriver(stack, scenario.segment_s, seed=7919)
            driver.start()
            end = time.monotonic() + remaining
            while time.monotonic() < end:
                await on_tick("steady load (after the incident)")
                await asyncio.sleep(1.0)
            extra = await driver.finish()
            if report.load is not None:
                report.load.segments += extra.segments  # Prometheus counts these too
        good_prom = await stack.settled_goodput()
        await _note_held_back(stack, t0, held)
        return _summary(report, stack, t0, good_prom, held)


def _fault_text(stack: LocalStack, scenario: Scenario) -> str:
    engine = stack.engine(scenario.slo_class)
    if engine.vllm is None:
        return f"{scenario.fault} (the simulator's fault API)"
    f = scenario.fault
    period = f.get("period_s", 0.3)
    return (f"a real {f['slowdown']:g}x slow-down (its vLLM engine core and worker run {1000 * period / f['slowdown']:.0f} "
            f"ms of every {period:g} s and are stopped the rest, as under a CPU quota)")


async def _note_held_back(stack: LocalStack, t0: float, held: dict[str, dict]) -> list[str]:
    """Record the alerts Alertmanager holds back by inhibition (a page silencing tickets); lines for new ones."""
    try:
        alerts = await stack.alertmanager_alerts()
    except Exception as e:  # a slow query must not stop the demo
        return [f"[{time.time() - t0:6.1f}s] (Alertmanager query failed: {e})"]
    lines = []
    for alert in alerts:
        if (alert.get("status") or {}).get("inhibitedBy") and alert.get("fingerprint") not in held:
            held[alert["fingerprint"]] = alert
            receivers = ",".join(r.get("name", "") for r in alert.get("receivers") or [])
            lines.append(f"[{time.time() - t0:6.1f}s] ... held back (a page of its service is firing): "
                         f"{show.short_name(alert)} -> {receivers}")
    return lines


def _summary(report: IncidentReport, stack: LocalStack, t0: float, good_prom: float | None,
             held: dict[str, dict]) -> int:
    notes = stack.webhook.notifications
    print("\n=== what happened ===")
    print("\n".join(show.timeline(t0, report.events)))
    print("\n=== what on-call received (Alertmanager webhook; times since the load started) ===")
    print("\n".join(show.notification_table(t0, notes)))
    print(show.summary_line(notes))
    resolved = sum(1 for n in notes if n.status == "resolved")
    print(f"  and {resolved} all-clear (resolved) notification{'s' if resolved != 1 else ''}")
    if report.fired is not None:
        until = report.resolved.received_at if report.resolved else time.time()
        during = sent_between(notes, TICKET_ROUTE, report.fired.received_at, until)
        pages = sent_between(notes, PAGE_ROUTE, report.fired.received_at, until)
        print(f"  while the page was open: {len(pages)} page, {len(during)} ticket notification"
              f"{'s' if len(during) != 1 else ''}")
        first = {show.short_name(a) for a in report.fired.firing()}
        joined = sorted({show.short_name(a) for n in notes if n.group_key == report.fired.group_key
                         for a in n.alerts} - first)
        if joined:
            print(f"  joined the open page without a new notification: {', '.join(joined)}")
    if held:
        print(f"  held back by the page (inhibited tickets): {', '.join(sorted({show.short_name(a) for a in held.values()}))}")
    print("  (tickets still firing after the all-clear are sent at the ticket group's interval: the incident's follow-up)")
    if report.load is not None:
        print("\n=== goodput ===")
        print(f"  load generator: {report.load.good()} good of {report.load.requests()} requests "
              f"(judged by the SLO file's thresholds)")
        print(f"  Prometheus:     sum({C.GOODPUT_REQUESTS.name}) = "
              f"{'-' if good_prom is None else int(good_prom)} (the taps' count, through the exporter)")
    ok = report.fired is not None and report.resolved is not None
    if report.fired and report.incident_at:
        print(f"\npaged {report.fired.received_at - report.incident_at:.1f}s after the fault; ", end="")
        if report.resolved and report.recovered_at:
            print(f"all clear {report.resolved.received_at - report.recovered_at:.1f}s after recovery.")
        else:
            print("the all-clear did NOT arrive in time.")
    elif not report.fired:
        print("\nthe page did NOT fire in time: see the Prometheus rules and logs in the work dir (--workdir keeps it)")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.fullstack", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=0.0, metavar="SECONDS",
                   help="run at least this long in total, with steady load after the incident (default: stop "
                        "once the page has resolved)")
    p.add_argument("--fast", action="store_true", help="the integration test's timers (1s scrapes, short waits)")
    p.add_argument("--steady", type=float, default=None, metavar="SECONDS", help="steady load before the incident")
    p.add_argument("--max-wait", type=float, default=180.0, metavar="SECONDS",
                   help="give up waiting for the page (and for its all-clear) after this long (default 180)")
    p.add_argument("--slo", action="append", default=[], metavar="PATH",
                   help="SLO files (default slos/; with --engine vllm demo/slos-vllm/chat.yaml and slos/fleet.yaml)")
    p.add_argument("--workdir", metavar="DIR", help="keep configs, logs and notifications here (default: a temp dir, "
                                                     "removed at exit)")
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                   help="sim: the embedded simulator (default); vllm: a real vLLM (CPU build, `make vllm-deps`)")
    args = p.parse_args(argv)
    return asyncio.run(_guarded(args))


async def _guarded(args: argparse.Namespace, run=_run) -> int:
    """Run the demo (`run`, the fleet demo's too) as a task that SIGINT/SIGTERM cancel, so the stack's cleanup
    always runs."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    caught: list[int] = []

    def cancel(sig: int) -> None:
        caught.append(sig)
        assert task is not None
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancel, sig)
    try:
        return await run(args)
    except asyncio.CancelledError:
        if not caught:
            raise
        assert task is not None
        task.uncancel()
        print(f"\nstopped by {signal.Signals(caught[0]).name}; everything the demo started has exited.",
              file=sys.stderr)
        return 128 + caught[0]
    except (StartError, FileNotFoundError, LookupError) as e:
        print(f"llmslo demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
