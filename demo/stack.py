"""The whole product on one machine: slogen's rules, simulated engines behind goodput taps, the node
exporter, Prometheus and Alertmanager, wired as they would be on a GPU node, on loopback ports.

`LocalStack` is what `python -m demo.fullstack` and the end-to-end test both run; only the timings differ
(`StackSettings.fast()` for the test). Every process is started in its own process group by a
`Supervisor`, and `stop()` (also reached from `async with`, exceptions and Ctrl-C) ends them all.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import yaml

from demo.alertmanager import AlertmanagerTimers, build_config, load_generated, route_timers, start_alertmanager
from demo.procs import Child, StartError, Supervisor, free_port
from demo.prometheus import PromClient, PrometheusTimers, start_prometheus
from demo.webhook import WebhookReceiver
from exporter.tap.classes import Objective, SloConfig, load_slo_config
from llmslo import conventions as C
from llmslo.files import write_atomic
from simulator.loadgen import run_load
from simulator.stats import RequestRecord
from simulator.workload import LengthDist, WorkItem, WorkloadSpec, generate
from slogen.artifacts.alertmanager import ALERTMANAGER_FILE

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SLOS = REPO / "slos"
DEMO_WINDOWS = REPO / "demo" / "windows.yaml"  # the compressed alert-window catalog, passed to slogen with --windows
DEMO_PERIOD = "1d"  # the period that catalog is for; `slogen build --override-period` puts every SLO on it
ALERTMANAGER_FILE_NAME = Path(ALERTMANAGER_FILE).name  # slogen writes it next to the rule files


@dataclass(frozen=True)
class EngineSpec:
    """One simulated inference pod: the engine, its tap, and the traffic it gets."""

    name: str  # pod name, also the exporter's target name prefix
    preset: str
    model: str
    slo_class: str  # the goodput class its traffic falls in (by the SLO files' model globs)
    lora: tuple[str, ...] = ()
    max_loras: int = 1
    gpu_memory_utilization: float = 0.0  # 0: the preset's; lower leaves a smaller KV cache (visible usage)
    rate: float = 1.0  # requests per second (Poisson)
    prompt_len: LengthDist = LengthDist(400, 0.4, 32, 2000)
    output_len: LengthDist = LengthDist(24, 0.3, 4, 64)
    shared_prefix: float = 0.5
    lora_mix: tuple[tuple[str, float], ...] = ()


# Served model names follow the SLO files' `models` globs (slos/chat.yaml: "llama-3-8b*,chat-*"; slos/batch.yaml:
# "batch-*"), so the taps put each request in its class the way production traffic would be, by model name.
DEFAULT_ENGINES = (
    EngineSpec("chat-llama-0", "llama3-8b-h100", "llama-3-8b-instruct", "interactive",
               lora=("chat-sql-lora", "chat-support-lora"), max_loras=2, gpu_memory_utilization=0.26, rate=2.0,
               output_len=LengthDist(12, 0.3, 4, 32),
               lora_mix=(("chat-sql-lora", 0.2), ("chat-support-lora", 0.2))),
    EngineSpec("batch-qwen-0", "qwen2.5-7b-h100", "batch-qwen2.5-7b", "batch",
               gpu_memory_utilization=0.24, rate=1.0, prompt_len=LengthDist(800, 0.4, 64, 3000),
               output_len=LengthDist(32, 0.3, 8, 96)),
)


@dataclass(frozen=True)
class StackSettings:
    slo_paths: tuple[Path, ...] = (DEFAULT_SLOS,)
    windows: Path = DEMO_WINDOWS
    period: str = DEMO_PERIOD
    runbook_base_url: str = REPO.as_uri()  # runbook links open the repo's docs/runbooks/*.md
    engines: tuple[EngineSpec, ...] = DEFAULT_ENGINES
    exporter_interval_s: float = 1.0
    prometheus: PrometheusTimers = PrometheusTimers(2.0, 2.0, 2.0)
    alertmanager: AlertmanagerTimers | None = None  # None: the timers slogen generated (alerts/alertmanager.yaml)
    gpus: int = 2
    cluster: str = "local-demo"
    namespace: str = "llm"
    node: str = "gpu-node-0"
    prebuilt_rules: tuple[Path, ...] = ()  # rule files to load instead of running slogen build
    workdir: Path | None = None  # None: a fresh temp dir, removed on stop
    keep_workdir: bool = False

    @classmethod
    def fast(cls, **changes) -> "StackSettings":
        """The integration test's setting: every timer at its shortest workable value."""
        base = cls(exporter_interval_s=0.5, prometheus=PrometheusTimers(1.0, 1.0, 1.0))
        return replace(base, **changes)


@dataclass
class EngineProcs:
    spec: EngineSpec
    sim_url: str
    tap_url: str
    tap_metrics_url: str
    sim: Child | None = None
    tap: Child | None = None


@dataclass
class LocalStack:
    settings: StackSettings = field(default_factory=StackSettings)
    workdir: Path = field(init=False)
    sup: Supervisor = field(init=False)
    webhook: WebhookReceiver = field(init=False)
    engines: list[EngineProcs] = field(default_factory=list)
    rule_files: list[Path] = field(default_factory=list)
    exporter_url: str = ""
    prometheus_url: str = ""
    alertmanager_url: str = ""
    alertmanager_config: dict = field(default_factory=dict)  # what Alertmanager runs: slogen's, receivers filled in
    slo: SloConfig | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _own_workdir: bool = False
    _session: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        if self.settings.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="llmslo-stack-"))
            self._own_workdir = True
        else:
            self.workdir = self.settings.workdir
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.sup = Supervisor(self.workdir / "logs")
        self.webhook = WebhookReceiver(self.workdir / "notifications.jsonl")

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> "LocalStack":
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        t0 = time.monotonic()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self.slo = load_slo_config([str(p) for p in self.settings.slo_paths])
        self._check_classes()
        self.rule_files = list(self.settings.prebuilt_rules) or await self._build_rules()
        self.timings["slogen_build_s"] = time.monotonic() - t0
        await self.webhook.start()
        waits = []
        for spec in self.settings.engines:
            waits += self._spawn_engine(spec)
        exporter, exporter_wait = self._spawn_exporter()
        waits.append(exporter_wait)
        self.alertmanager_config = build_config(load_generated(self._generated_alertmanager()), self.webhook.url,
                                                self.settings.alertmanager)
        am_task = asyncio.ensure_future(start_alertmanager(self.sup, self.workdir, self.alertmanager_config))
        await asyncio.gather(*waits)
        _, self.alertmanager_url = await am_task
        _, self.prometheus_url = await start_prometheus(
            self.sup, self.workdir, self.exporter_url.removeprefix("http://"), self.rule_files,
            self.alertmanager_url, self.settings.prometheus, self.settings.cluster)
        self.timings["start_s"] = time.monotonic() - t0

    async def stop(self) -> None:
        """Stop every process and server this stack started; safe to call twice."""
        await self.sup.stop()
        await self.webhook.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._own_workdir and not self.settings.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ pieces
    def _check_classes(self) -> None:
        """Each engine's models (base and adapters) must fall in its class by the SLO files' model globs;
        otherwise the incident would degrade a pool whose SLOs it does not watch."""
        assert self.slo is not None
        for spec in self.settings.engines:
            for model in (spec.model, *spec.lora):
                got = self.slo.resolve({}, model).slo_class
                if got != spec.slo_class:
                    raise StartError(f"engine {spec.name}: the SLO files put model {model!r} in class {got!r}, not "
                                     f"{spec.slo_class!r}; fix the `models` globs of the llmslo/goodput SLI or the "
                                     "engine's model name")

    async def _build_rules(self) -> list[Path]:
        """`slogen build` of the SLO specs on the compressed demo period (its catalog given with `--windows`),
        into the work dir.

        `--no-autoscaling`: the repo's KEDA pools scale on a 5m burn window of the 30d catalog, which a
        compressed-period build does not record. The demo needs the rules only; its runbook links point
        at the repo's docs/runbooks.
        """
        out = self.workdir / "slogen"
        argv = [sys.executable, "-m", "slogen.cli", "build", *(str(p) for p in self.settings.slo_paths),
                "--out", str(out), "--windows", str(self.settings.windows), "--override-period", self.settings.period,
                "--no-autoscaling",
                "--runbook-base-url", self.settings.runbook_base_url]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, cwd=REPO)
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            raise StartError(f"slogen build failed (exit {proc.returncode}): {' '.join(argv)}\n"
                             f"{output.decode(errors='replace')[-3000:]}")
        rules = sorted((out / "alerts").glob("*.rules.yaml"))
        if not rules:
            raise StartError(f"slogen build wrote no alerts/*.rules.yaml under {out}")
        return rules

    def _generated_alertmanager(self) -> Path:
        """slogen's alerts/alertmanager.yaml: the one built with the rules, else the repository's committed one
        (prebuilt rule files without it beside them)."""
        for rules in self.rule_files:
            if (rules.parent / ALERTMANAGER_FILE_NAME).is_file():
                return rules.parent / ALERTMANAGER_FILE_NAME
        return REPO / ALERTMANAGER_FILE

    def _spawn_engine(self, spec: EngineSpec) -> list:
        sim_port, tap_port, tap_metrics_port = free_port(), free_port(), free_port()
        sim_argv = [sys.executable, "-m", "simulator.cli", "serve", "--host", "127.0.0.1", "--port", str(sim_port),
                    "--preset", spec.preset, "--model", spec.model, "--seed", str(len(self.engines))]
        if spec.lora:
            sim_argv += ["--lora", ",".join(spec.lora), "--max-loras", str(spec.max_loras)]
        if spec.gpu_memory_utilization:
            sim_argv += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
        procs = EngineProcs(spec, f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{tap_port}",
                            f"http://127.0.0.1:{tap_metrics_port}/metrics")
        procs.sim = self.sup.spawn(f"sim-{spec.name}", sim_argv)
        tap_argv = [sys.executable, "-m", "exporter.tap", "--listen", f"127.0.0.1:{tap_port}",
                    "--upstream", procs.sim_url, "--metrics-listen", f"127.0.0.1:{tap_metrics_port}",
                    "--log-level", "warning"]
        for p in self.settings.slo_paths:
            tap_argv += ["--slo", str(p)]
        procs.tap = self.sup.spawn(f"tap-{spec.name}", tap_argv)
        self.engines.append(procs)
        return [self.sup.wait_http(procs.sim, procs.sim_url + "/health"),
                self.sup.wait_http(procs.tap, procs.tap_metrics_url)]

    def _spawn_exporter(self):
        s = self.settings
        targets = []
        for e in self.engines:
            identity = {"pod": e.spec.name, "namespace": s.namespace, "model": e.spec.model}
            targets.append({"kind": "vllm", "url": e.sim_url + "/metrics", "name": f"{e.spec.name}/engine", **identity})
            targets.append({"kind": "tap", "url": e.tap_metrics_url, "name": f"{e.spec.name}/tap", **identity})
        port = free_port()
        config = {"listen": f"127.0.0.1:{port}", "interval": f"{int(s.exporter_interval_s * 1000)}ms",
                  "gpu": f"fake:{s.gpus}", "node_name": s.node, "log_level": "warning", "targets": targets}
        path = self.workdir / "exporter.yaml"
        write_atomic(path, yaml.safe_dump(config, sort_keys=False))
        self.exporter_url = f"http://127.0.0.1:{port}"
        child = self.sup.spawn("exporter", [sys.executable, "-m", "exporter", "--config", str(path)])
        return child, self.sup.wait_http(child, self.exporter_url + "/readyz")

    # ------------------------------------------------------------------ using it
    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the stack is not started"
        return self._session

    def prom(self) -> PromClient:
        return PromClient(self.session, self.prometheus_url)

    def page_timers(self) -> AlertmanagerTimers:
        """The page route's timers in the running configuration (the pipeline's delay to a page)."""
        return route_timers(self.alertmanager_config)

    async def alertmanager_alerts(self) -> list[dict]:
        """Alertmanager's view of the alerts it holds (API v2), with each one's inhibition status."""
        async with self.session.get(self.alertmanager_url + "/api/v2/alerts") as resp:
            resp.raise_for_status()
            return await resp.json()

    def engine(self, name_or_class: str) -> EngineProcs:
        for e in self.engines:
            if name_or_class in (e.spec.name, e.spec.slo_class):
                return e
        raise KeyError(f"no engine named or serving class {name_or_class!r}")

    def workload(self, engine: EngineProcs, duration_s: float, seed: int = 0) -> WorkloadSpec:
        s = engine.spec
        return WorkloadSpec(rate=s.rate, duration=duration_s, prompt_len=s.prompt_len, output_len=s.output_len,
                            shared_prefix=s.shared_prefix, lora_mix=s.lora_mix, seed=seed)

    async def drive_load(self, duration_s: float, seed: int = 0) -> dict[str, "LoadResult"]:
        """Open-loop load through every tap for `duration_s` seconds of arrivals; waits for every request
        to finish. Returns each engine's records with the thresholds its class is judged by."""

        async def one(e: EngineProcs, i: int) -> LoadResult:
            spec = self.workload(e, duration_s, seed + i)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=300)) as session:
                records = await run_load(e.tap_url, spec, model=e.spec.model, session=session)
            items = generate(spec)  # the same seeded requests run_load sent, in the same order
            return LoadResult(e.spec, items, records, [self.objective(it.lora or e.spec.model) for it in items])

        results = await asyncio.gather(*(one(e, i) for i, e in enumerate(self.engines)))
        return {r.engine.name: r for r in results}

    def objective(self, model: str) -> Objective:
        """What the tap holds a request for `model` to: the tap's own class resolution over the same SLO files."""
        assert self.slo is not None
        return self.slo.resolve({}, model)

    async def set_faults(self, engine: EngineProcs, patch: dict) -> dict:
        """POST the simulator's admin fault API (e.g. {"slowdown": 8}; {"reset": true} to recover)."""
        async with self.session.post(engine.sim_url + "/admin/faults", json=patch) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{engine.spec.name}: /admin/faults {patch}: HTTP {resp.status}: {body}")
            return body

    async def stage_incident(self, name_or_class: str, fault: dict) -> dict:
        """Degrade one pool through its simulator's admin fault API, e.g. {"slowdown": 30}."""
        return await self.set_faults(self.engine(name_or_class), fault)

    async def recover(self, name_or_class: str) -> dict:
        return await self.set_faults(self.engine(name_or_class), {"reset": True})

    async def settled_goodput(self) -> float | None:
        """sum(llm_goodput_requests_total) once everything finished so far is in Prometheus: waits for an exporter
        cycle that started after now, then for a Prometheus scrape after that cycle."""
        s = self.settings
        cycle_done = time.time() + s.exporter_interval_s + 0.05  # a full cycle after the last request finished
        await asyncio.sleep(s.exporter_interval_s)
        deadline = time.monotonic() + 5 * s.prometheus.scrape_interval_s + 5
        while time.monotonic() < deadline:
            last = await self.prom().last_scrape()
            if last is not None and last > cycle_done:
                break
            await asyncio.sleep(0.2)
        return await self.prom().scalar(f"sum({C.GOODPUT_REQUESTS.name})")

    async def exporter_page(self) -> str:
        async with self.session.get(self.exporter_url + "/metrics") as resp:
            return await resp.text()

    def urls(self) -> dict[str, str]:
        out = {"prometheus": self.prometheus_url, "alertmanager": self.alertmanager_url,
               "exporter": self.exporter_url + "/metrics", "webhook": self.webhook.url}
        for e in self.engines:
            out[f"{e.spec.name} (tap)"] = e.tap_url
            out[f"{e.spec.name} (engine)"] = e.sim_url
        return out


@dataclass
class LoadResult:
    engine: EngineSpec
    items: list[WorkItem]
    records: list[RequestRecord]
    objectives: list[Objective]  # per request: its class and thresholds, from the SLO files

    def good_flags(self) -> list[bool]:
        """Per request, whether the load generator itself judges it good under its class's thresholds."""
        inf = float("inf")
        return [r.good(o.ttft if o.ttft is not None else inf, o.tpot if o.tpot is not None else inf)
                for r, o in zip(self.records, self.objectives)]

    def good(self) -> int:
        return sum(self.good_flags())
