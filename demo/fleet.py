"""The fleet on one machine: two clusters remote-writing into VictoriaMetrics, slogen's rules in vmalert.

    cluster a: simulator engines <- taps, the exporter, Prometheus (agent mode, external_labels cluster="a") ─┐
    cluster b: the same, external_labels cluster="b" ────────────────────────────────────────── remote-write ─┤
                                                                                                              v
    VictoriaMetrics single-node (the fleet store; its Prometheus API answers the dashboards) <── vmalert
    vmalert: slogen's alerts/*.rules.yaml over the fleet, recordings written back to VictoriaMetrics,
             alerts to Alertmanager (slogen's alerts/alertmanager.yaml) -> the webhook standing in for on-call

`python -m demo --fleet` stages the single-cluster demo's incident (demo/incident.py) in cluster a only: the
page must carry cluster="a" and nothing may fire for b. Each cluster is a `ClusterStack` (the local stack's
engines and exporter, its Prometheus replaced by an agent that only scrapes and remote-writes); the central
part is a `FleetStack`, which has the local stack's interface (engines, load, faults, webhook), so the same
incident code drives it. Every binary comes from Debian (`prometheus`, `prometheus-alertmanager`,
`victoria-metrics`), every process runs under the demo's Supervisor, on loopback ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp

from demo import show
from demo.alertmanager import PAGE_ROUTE, build_config, find_binary, load_generated, start_alertmanager, write_config
from demo.incident import (
    Scenario,
    SloRef,
    describe,
    expected_fire_bound,
    fastest_page_tier,
    pipeline_lag_s,
    run_incident,
)
from demo.procs import Child, Supervisor, free_port, free_url, fresh_dir
from demo.prometheus import EXPORTER_JOB, PROMETHEUS_BINARIES, PrometheusTimers
from demo.stack import DEFAULT_ENGINES, EngineSpec, LocalStack, StackSettings
from demo.webhook import Notification
from exporter.tap.classes import load_slo_config
from llmslo import conventions as C
from slogen.durations import format_seconds

VICTORIA_METRICS_BINARIES = ("/usr/bin/victoria-metrics", "victoria-metrics")
VMALERT_BINARIES = ("/usr/bin/vmalert", "vmalert")
DEBIAN_HINT = "run `make system-deps` (Debian: apt-get install victoria-metrics prometheus prometheus-alertmanager)"


@dataclass(frozen=True)
class FleetTimers:
    """The hops a sample takes past one Prometheus: remote-write batching, the store's visibility delay, and
    vmalert's evaluation and write-back of recordings (a recording is visible to the next rule only after it)."""

    remote_write_deadline_s: float = 1.0  # Prometheus queue_config.batch_send_deadline (default 5s)
    # VictoriaMetrics -search.latencyOffset (default 30s): queries do not see samples newer than this. It must
    # cover a scrape's trip (batch deadline + ingestion), or a rule can read a half-written scrape (a histogram's
    # _count newer than its _bucket series reads as errors); the demo's 2s covers its 1s deadline.
    latency_offset_s: float = 2.0
    evaluation_interval_s: float = 1.0  # vmalert -evaluationInterval, for every group
    write_back_s: float = 0.5  # vmalert -remoteWrite.flushInterval: recordings reach the store this often
    # vmalert -rule.resendDelay. vmalert also stamps each alert it sends with endsAt = 4 x max(interval, resend
    # delay) after the evaluation; at a 1s interval that is 4s, and a ruler lagging on a busy machine delivers
    # alerts Alertmanager already takes as resolved (no page at all). 4s gives them 16s.
    resend_delay_s: float = 4.0
    # Measured on Debian's VictoriaMetrics 1.79: a sample of an existing series is searchable about 1s after it
    # arrives, a new series about 9-10s after its first sample. Each recording rule's first output is a new
    # series, so a chain of N recordings needs about N x 10s after start-up before its last link has data.
    new_series_s: float = 10.0

    def hop_s(self) -> float:
        """Worst-case delay one recording rule adds on top of what Prometheus alone would: it is evaluated,
        written back, then hidden for the latency offset before the next rule can read it."""
        return self.evaluation_interval_s + self.write_back_s + self.latency_offset_s


@dataclass(frozen=True)
class FleetSettings:
    """Which clusters, what runs in each, and where the incident is staged."""

    stack: StackSettings = field(default_factory=StackSettings)  # SLOs, windows, scrape timers, per-cluster node
    clusters: tuple[str, ...] = ("a", "b")
    engines: tuple[EngineSpec, ...] = DEFAULT_ENGINES  # run in every cluster, pod names prefixed with the cluster
    incident_cluster: str = "a"
    timers: FleetTimers = FleetTimers()

    @classmethod
    def fast(cls, **changes) -> "FleetSettings":
        """The integration test's setting: the local stack's fast timers, the same fleet hops."""
        return replace(cls(stack=StackSettings.fast()), **changes)

    def cluster_engines(self, cluster: str) -> tuple[EngineSpec, ...]:
        """The engines of one cluster: pod `<cluster>-<name>`, so every pod is one engine fleet-wide and the load
        generator's per-engine results and the incident's target stay unambiguous."""
        return tuple(replace(e, name=f"{cluster}-{e.name}") for e in self.engines)

    def all_engines(self) -> tuple[EngineSpec, ...]:
        """Every cluster's engines, the incident cluster's first (the incident degrades the first engine of its class)."""
        order = [self.incident_cluster, *(c for c in self.clusters if c != self.incident_cluster)]
        return tuple(e for c in order for e in self.cluster_engines(c))

    def validate(self) -> None:
        if len(set(self.clusters)) != len(self.clusters) or len(self.clusters) < 2:
            raise ValueError(f"FleetSettings.clusters: need two or more distinct cluster names, got {self.clusters}")
        if self.incident_cluster not in self.clusters:
            raise ValueError(f"FleetSettings.incident_cluster {self.incident_cluster!r} is not one of {self.clusters}")


# ---------------------------------------------------------------------------------------------------- processes
def agent_config(exporter_hostport: str, timers: PrometheusTimers, cluster: str, remote_write_url: str,
                 deadline_s: float) -> dict:
    """A cluster's Prometheus: scrape the exporter, add `cluster` as an external label, remote-write everything.
    No rules and no Alertmanager here: the fleet's rules run centrally in vmalert."""
    return {
        "global": {
            "scrape_interval": format_seconds(timers.scrape_interval_s),
            "scrape_timeout": format_seconds(min(timers.scrape_interval_s, 10.0)),
            "external_labels": {C.LABEL_CLUSTER: cluster},
        },
        "scrape_configs": [{"job_name": EXPORTER_JOB, "static_configs": [{"targets": [exporter_hostport]}]}],
        "remote_write": [{
            "url": f"{remote_write_url}/api/v1/write",
            "queue_config": {"batch_send_deadline": format_seconds(deadline_s), "min_backoff": "100ms",
                             "max_backoff": format_seconds(max(deadline_s, 1.0))},
        }],
    }


async def start_prometheus_agent(sup: Supervisor, workdir: Path, config: dict, name: str) -> tuple[Child, str]:
    """Prometheus in agent mode (scrape and remote-write, no local TSDB or queries) on a free loopback port."""
    binary = find_binary(PROMETHEUS_BINARIES)
    prom_dir = workdir / "prometheus-agent"
    wal = fresh_dir(prom_dir / "wal")
    path = write_config(prom_dir / "prometheus.yml", config)
    port, url = free_url()
    child = sup.spawn(name, [binary, "--enable-feature=agent", f"--config.file={path}",
                             f"--storage.agent.path={wal}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"])
    await sup.wait_http(child, f"{url}/-/ready", timeout_s=60)
    return child, url


async def start_victoria_metrics(sup: Supervisor, workdir: Path, timers: FleetTimers) -> tuple[Child, str]:
    """VictoriaMetrics single-node with a fresh store. `-search.latencyOffset` is cut from 30s to the fleet's
    timers: the default hides the last 30s from every query, which would delay each rule hop by as much."""
    binary = _binary(VICTORIA_METRICS_BINARIES)
    data = fresh_dir(workdir / "victoria-metrics")
    port, url = free_url()
    child = sup.spawn("victoria-metrics", [
        binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=1d",
        f"-search.latencyOffset={format_seconds(timers.latency_offset_s)}", "-loggerLevel=WARN",
    ])
    await sup.wait_http(child, f"{url}/health", timeout_s=30)
    return child, url


def vmalert_argv(binary: str, rule_files: list[Path], vm_url: str, alertmanager_url: str, port: int,
                 timers: FleetTimers) -> list[str]:
    """vmalert evaluating `rule_files` against the store, writing recordings and alert state back to it.

    `-disableAlertgroupLabel`: vmalert otherwise adds `alertgroup=<group>` to every recorded series and alert,
    so the fleet's recordings would not carry the labels Prometheus gives the same rules (and dashboards and
    `and` between groups would see an extra label). `-datasource.queryStep` is the instant queries' look-back
    for the last sample: Prometheus' 5m, as the rules were written for."""
    argv = [binary, f"-datasource.url={vm_url}", f"-remoteWrite.url={vm_url}", f"-remoteRead.url={vm_url}",
            f"-notifier.url={alertmanager_url}", f"-httpListenAddr=127.0.0.1:{port}",
            f"-evaluationInterval={format_seconds(timers.evaluation_interval_s)}",
            f"-remoteWrite.flushInterval={int(timers.write_back_s * 1000)}ms",
            f"-rule.resendDelay={format_seconds(timers.resend_delay_s)}",
            "-datasource.queryStep=5m", "-disableAlertgroupLabel", "-loggerLevel=WARN"]
    return argv + [f"-rule={p}" for p in rule_files]


def _binary(candidates: tuple[str, ...]) -> str:
    try:
        return find_binary(candidates)
    except FileNotFoundError:
        raise FileNotFoundError(f"none of {', '.join(candidates)} is installed; {DEBIAN_HINT}") from None


# ---------------------------------------------------------------------------------------------------- stacks
@dataclass
class FleetSupervisor(Supervisor):
    """The central processes' supervisor; `check_alive` (what the incident loop calls) covers every cluster's too."""

    clusters: list[Supervisor] = field(default_factory=list)

    def check_alive(self) -> None:
        super().check_alive()
        for sup in self.clusters:
            sup.check_alive()


@dataclass
class ClusterStack(LocalStack):
    """One cluster: the local stack's engines, taps and exporter; a Prometheus agent instead of a Prometheus."""

    remote_write_url: str = ""
    deadline_s: float = 1.0

    async def start(self) -> None:
        t0 = time.monotonic()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        waits = [w for spec in self.settings.engines for w in self._spawn_engine(spec)]
        _, exporter_wait = self._spawn_exporter()
        await asyncio.gather(*waits, exporter_wait)
        config = agent_config(self.exporter_url.removeprefix("http://"), self.settings.prometheus,
                              self.settings.cluster, self.remote_write_url, self.deadline_s)
        _, self.prometheus_url = await start_prometheus_agent(self.sup, self.workdir, config, "prometheus-agent")
        self.timings["start_s"] = time.monotonic() - t0


@dataclass
class FleetStack(LocalStack):
    """The store, the ruler, Alertmanager and on-call, plus every cluster; the local stack's interface over all
    clusters' engines (`engine`, `drive_load`, `stage_incident`, `recover`), with `prom()` reading the store."""

    fleet: FleetSettings = field(default_factory=FleetSettings)
    clusters: dict[str, ClusterStack] = field(default_factory=dict)
    vm_url: str = ""
    vmalert_url: str = ""

    def __post_init__(self) -> None:
        self.fleet.validate()
        self.settings = replace(self.fleet.stack, engines=self.fleet.all_engines(), cluster="fleet")
        super().__post_init__()
        self.fleet_sup = FleetSupervisor(self.sup.log_dir)
        self.sup = self.fleet_sup

    async def start(self) -> None:
        t0 = time.monotonic()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        _binary(VICTORIA_METRICS_BINARIES)  # both checked before anything starts
        vmalert_binary = _binary(VMALERT_BINARIES)
        self.slo = load_slo_config([str(p) for p in self.settings.slo_paths])
        self._check_classes()
        self.rule_files = list(self.settings.prebuilt_rules) or await self._build_rules()
        self.timings["slogen_build_s"] = time.monotonic() - t0
        await self.webhook.start()
        self.alertmanager_config = build_config(load_generated(self._generated_alertmanager()), self.webhook.url,
                                                self.settings.alertmanager)
        (_, self.alertmanager_url), (_, self.vm_url) = await asyncio.gather(
            start_alertmanager(self.sup, self.workdir, self.alertmanager_config),
            start_victoria_metrics(self.sup, self.workdir, self.fleet.timers))
        port = free_port()
        child = self.sup.spawn("vmalert", vmalert_argv(vmalert_binary, self.rule_files, self.vm_url,
                                                       self.alertmanager_url, port, self.fleet.timers))
        self.vmalert_url = f"http://127.0.0.1:{port}"
        self.prometheus_url = self.vm_url  # what prom() and the status block read: the store's Prometheus API
        for name in self.fleet.clusters:
            self.clusters[name] = ClusterStack(
                replace(self.fleet.stack, engines=self.fleet.cluster_engines(name), cluster=name,
                        node=f"{name}-{self.fleet.stack.node}", workdir=self.workdir / f"cluster-{name}",
                        keep_workdir=True),
                remote_write_url=self.vm_url, deadline_s=self.fleet.timers.remote_write_deadline_s)
            self.fleet_sup.clusters.append(self.clusters[name].sup)
        await asyncio.gather(self.sup.wait_http(child, f"{self.vmalert_url}/-/healthy", timeout_s=30),
                             *(c.start() for c in self.clusters.values()))
        order = {e.name: i for i, e in enumerate(self.settings.engines)}
        self.engines = sorted((e for c in self.clusters.values() for e in c.engines), key=lambda e: order[e.spec.name])
        self.timings["start_s"] = time.monotonic() - t0

    async def stop(self) -> None:
        """vmalert first, while the store still takes its last writes (otherwise it retries for seconds), then
        the clusters, then the rest."""
        await asyncio.get_running_loop().run_in_executor(None, self._stop_vmalert)
        for c in self.clusters.values():
            await c.stop()
        await super().stop()

    def _stop_vmalert(self) -> None:
        for child in self.sup.children:
            if child.name == "vmalert" and child.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pgid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=self.sup.grace_s)

    def process_groups(self) -> list[int]:
        return self.sup.process_groups() + [g for c in self.clusters.values() for g in c.sup.process_groups()]

    async def vmalert_alerts(self) -> list[dict]:
        """vmalert's active alerts (pending and firing), each with its labels and state."""
        async with self.session.get(self.vmalert_url + "/api/v1/alerts") as resp:
            resp.raise_for_status()
            body = await resp.json()
        return list((body.get("data") or {}).get("alerts") or [])

    async def label_values(self, label: str, match: str) -> list[str]:
        """The store's values of `label` on series matching `match` (Grafana's label_values() variable query)."""
        async with self.session.get(f"{self.vm_url}/api/v1/label/{label}/values", params={"match[]": match}) as resp:
            resp.raise_for_status()
            return sorted((await resp.json()).get("data") or [])

    def urls(self) -> dict[str, str]:
        out = {"victoria-metrics (Prometheus API)": self.vm_url, "vmalert": self.vmalert_url,
               "alertmanager": self.alertmanager_url, "webhook": self.webhook.url}
        for name, c in self.clusters.items():
            out[f"cluster {name}: prometheus agent"] = c.prometheus_url
            out[f"cluster {name}: exporter"] = c.exporter_url + "/metrics"
        return out


# ---------------------------------------------------------------------------------------------------- the demo
def fleet_bound(stack: FleetStack, slo: SloRef, tier: str, bad_share: float, completion_lag_s: float) -> float:
    """Seconds from the fault to the page, at most: the local stack's bound (demo/incident.py) plus the fleet's
    hops: remote-write batching and, per rule hop (raw -> SLI ratio -> alert), vmalert's write-back and the
    store's latency offset; plus one new series' delay, for SLI ratios first recorded during the incident (a
    short steady phase)."""
    t = stack.fleet.timers
    base = expected_fire_bound(stack.settings, stack.page_timers(), slo, tier, bad_share, completion_lag_s)
    return base + t.remote_write_deadline_s + t.latency_offset_s + 2 * t.hop_s() + t.new_series_s


def page_clusters(notes: list[Notification]) -> set[str]:
    """The `cluster` of every firing alert on-call was paged for."""
    return {a.get("labels", {}).get(C.LABEL_CLUSTER, "") for n in notes
            if n.route == PAGE_ROUTE and n.status == "firing" for a in n.firing()}


async def fleet_status(stack: FleetStack, window: str) -> list[str]:
    """Per cluster, read from the store: requests/s and goodput of each class, and the alerts firing there."""
    prom = stack.prom()
    cls, cl = C.LABEL_SLO_CLASS, C.LABEL_CLUSTER
    neutral = "|".join((C.OUTCOME_CLIENT_DISCONNECTED, C.OUTCOME_CLIENT_ERROR))
    rps = await prom.query(f"sum by ({cl}, {cls}) (rate({C.TAP_REQUESTS.name}[{window}]))")
    good = await prom.query(f"sum by ({cl}, {cls}) (rate({C.GOODPUT_REQUESTS.name}[{window}])) / sum by ({cl}, {cls}) "
                            f"(rate({C.TAP_REQUESTS.name}{{{C.LABEL_OUTCOME}!~\"{neutral}\"}}[{window}]))")
    firing = [a for a in await stack.vmalert_alerts() if a.get("state") == "firing"]
    lines = []
    for name in stack.fleet.clusters:
        parts = []
        for r in sorted(rps, key=lambda r: r["metric"].get(cls, "")):
            if r["metric"].get(cl) != name:
                continue
            g = next((float(x["value"][1]) for x in good if x["metric"] == r["metric"]), float("nan"))
            parts.append(f"{r['metric'].get(cls, '?')} {float(r['value'][1]):.1f} req/s goodput {g:.0%}")
        here = sorted({a.get("name", "?") for a in firing if a.get("labels", {}).get(cl) == name})
        parts = parts or [f"no traffic in the store yet (a new series is searchable ~{stack.fleet.timers.new_series_s:.0f}s "
                          "after its first sample)"]
        lines.append(f"  cluster {name}: {'; '.join(parts)}; firing: {', '.join(here) or 'nothing'}")
    return lines


async def run_fleet_demo(args: argparse.Namespace) -> int:
    base = StackSettings.fast() if args.fast else StackSettings()
    fleet = FleetSettings(stack=replace(base, workdir=Path(args.workdir) if args.workdir else None,
                                        keep_workdir=bool(args.workdir)))
    steady = args.steady if args.steady is not None else (10.0 if args.fast else 20.0)
    scenario = Scenario(steady_s=steady, min_incident_s=0.0 if args.fast else 10.0, max_incident_s=args.max_wait,
                        max_resolve_s=args.max_wait)
    print(f"llmslo fleet demo: VictoriaMetrics, vmalert, Alertmanager, and {len(fleet.clusters)} clusters "
          f"({', '.join(fleet.clusters)}), each with {len(fleet.engines)} simulated engines behind taps, an exporter "
          f"and a Prometheus agent remote-writing to VictoriaMetrics ...", flush=True)
    async with FleetStack(fleet=fleet) as stack:
        print(f"fleet up in {stack.timings['start_s']:.1f}s (work dir {stack.workdir}):")
        for name, url in stack.urls().items():
            print(f"  {name:<34} {url}")
        print(f"  rules in vmalert: {', '.join(p.name for p in stack.rule_files)}\n", flush=True)
        window = f"{int(10 * fleet.stack.prometheus.scrape_interval_s)}s"
        t0 = time.time()
        last = [0.0]
        seen = [0]

        async def on_tick(phase: str) -> None:
            for note in stack.webhook.notifications[seen[0]:]:
                print("\n".join(show.render_notification(t0, note)), flush=True)
            seen[0] = len(stack.webhook.notifications)
            if time.monotonic() - last[0] >= (3.0 if args.fast else 5.0):
                last[0] = time.monotonic()
                try:
                    lines = await fleet_status(stack, window)
                except Exception as e:  # a slow query must not stop the demo
                    lines = [f"  (query failed: {e})"]
                print(f"[{time.time() - t0:6.1f}s] {phase}\n" + "\n".join(lines), flush=True)

        report = await run_incident(stack, scenario, on_tick)
        await on_tick("done")
        print("\n=== what happened ===")
        print("\n".join(show.timeline(t0, report.events)))
        print("\n=== what on-call received ===")
        print("\n".join(show.notification_table(t0, stack.webhook.notifications)))
        print(show.summary_line(stack.webhook.notifications))
        paged = page_clusters(stack.webhook.notifications)
        others = sorted({a.get("labels", {}).get(C.LABEL_CLUSTER, "(none)") for a in await stack.vmalert_alerts()
                         if a.get("state") == "firing"} - {fleet.incident_cluster})
        print(f"  paged for cluster(s): {', '.join(sorted(paged)) or 'none'}; firing elsewhere now: "
              f"{', '.join(others) or 'nothing'}")
        if report.fired and report.incident_at:
            print(f"\npaged {report.fired.received_at - report.incident_at:.1f}s after the fault in cluster "
                  f"{fleet.incident_cluster} ({describe(report.fired)}); bound {fleet_bound(stack, report.slo, fastest_page_tier(stack.settings), 1.0, 0.0):.0f}s "
                  f"plus the slowed requests' latency (pipeline {pipeline_lag_s(stack.settings, stack.page_timers()):.0f}s "
                  f"+ fleet hops)")
        ok = report.fired is not None and paged == {fleet.incident_cluster} and not others
        if report.resolved and report.recovered_at:
            print(f"all clear {report.resolved.received_at - report.recovered_at:.1f}s after recovery.")
        else:
            ok = False
            print("the page or its all-clear did NOT arrive in time: see the work dir's logs (--workdir keeps it)")
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    from demo.fullstack import _guarded

    p = argparse.ArgumentParser(prog="python -m demo --fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--fast", action="store_true", help="the integration test's timers (1s scrapes, short waits)")
    p.add_argument("--steady", type=float, default=None, metavar="SECONDS", help="steady load before the incident")
    p.add_argument("--max-wait", type=float, default=180.0, metavar="SECONDS",
                   help="give up waiting for the page (and for its all-clear) after this long (default 180)")
    p.add_argument("--workdir", metavar="DIR", help="keep configs, logs and notifications here")
    args = p.parse_args(argv)
    return asyncio.run(_guarded(args, run_fleet_demo))


if __name__ == "__main__":
    sys.exit(main())
