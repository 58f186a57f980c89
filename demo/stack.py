"""The whole product on one machine: slogen's rules, engines behind goodput taps, the node exporter,
Prometheus and Alertmanager, wired as they would be on a GPU node, on loopback ports. The engines are the
simulator (the default) or real vLLM engines (the CPU build serving the tiny model of `realengine/`:
`VLLM_ENGINES`), the rest is the same.

`LocalStack` is what `python -m demo.fullstack` and the end-to-end test both run; only the timings differ
(`StackSettings.fast()` for the test). Every process is started in its own process group by a
`Supervisor`, and `stop()` (also reached from `async with`, exceptions and Ctrl-C) ends them all.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Self

import aiohttp
import yaml

from demo import realload
from demo.alertmanager import AlertmanagerTimers, build_config, load_generated, route_timers, start_alertmanager
from demo.procs import Child, StartError, Supervisor, free_port
from demo.prometheus import PromClient, PrometheusTimers, start_prometheus
from demo.webhook import WebhookReceiver
from exporter.tap.classes import Objective, SloConfig, load_slo_config
from llmslo import conventions as C
from llmslo.files import write_atomic
from realengine import vllm_server
from realengine.vllm_server import VllmConfig, VllmServer
from simulator.loadgen import run_load
from simulator.stats import RequestRecord
from simulator.workload import LengthDist, WorkItem, WorkloadSpec, generate
from slogen.artifacts.alertmanager import ALERTMANAGER_FILE

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SLOS = REPO / "slos"
DEMO_WINDOWS = REPO / "demo" / "windows.yaml"  # the compressed alert-window catalog, passed to slogen with --windows
DEMO_PERIOD = "1d"  # the period that catalog is for; `slogen build --override-period` puts every SLO on it
ALERTMANAGER_FILE_NAME = Path(ALERTMANAGER_FILE).name  # slogen writes it next to the rule files


SIM = "sim"
VLLM = C.ENGINE_VLLM  # a real vLLM (CPU build): its engine kind


@dataclass(frozen=True)
class EngineSpec:
    """One inference pod: the engine (simulated, or a real vLLM), its tap, and the traffic it gets."""

    name: str  # pod name, also the exporter's target name prefix
    preset: str  # the simulator's preset ("" for a real engine)
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
    engine: str = SIM  # SIM: the simulator; VLLM: a real vLLM (CPU build), served model name `model`
    kv_blocks: int = 0  # VLLM: KV-cache blocks (--num-gpu-blocks-override); 0: VllmConfig's default
    max_num_seqs: int = 16  # VLLM: the engine's batch limit


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


# The real engine: one vLLM (CPU build, `make vllm-deps`) serving the tiny random Llama of realengine/ under a
# served name the interactive SLOs' model globs match (slos/chat.yaml: "chat-*"). Its KV cache (512 blocks of 32
# tokens: 16,384 tokens) holds the batch limit's worth of these requests twice over, so a backlog queues without
# preempting and the fleet's KV-headroom SLO (90%) stays out of the incident. Prompts are the model's own words
# (demo/realload.py); lengths are the interactive pool's, a little shorter: the engine shares two CPU cores with
# the whole stack.
VLLM_ENGINES = (
    EngineSpec("chat-vllm-0", "", "chat-tiny-llama", "interactive", engine=VLLM, kv_blocks=512, rate=2.0,
               prompt_len=LengthDist(200, 0.4, 16, 800), output_len=LengthDist(16, 0.3, 4, 32), shared_prefix=0.5),
)

# The real engine's fault: 30 times slower, like the simulator's {"slowdown": 30}, for real (LocalStack.throttle):
# its engine core and worker get 100 ms of every 3 s, as a CPU quota of cpu.max "100000 3000000" would allow. The
# long period makes the damage plain: a request arriving in the stopped part waits up to 2.9 s for its first
# token, and one whose tokens straddle a stop averages 190 ms or more per token, far past the SLOs' 1 s and
# 100 ms, while the unlucky few that fit in a running slice stay fast; few requests land near a threshold.
VLLM_FAULT = {"slowdown": 30.0, "period_s": 3.0}
# The real-engine demo's SLOs: thresholds for the CPU engine (demo/slos-vllm/chat.yaml says why), and the fleet's.
VLLM_SLOS = (REPO / "demo" / "slos-vllm" / "chat.yaml", DEFAULT_SLOS / "fleet.yaml")


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
    sim_url: str  # the engine's base URL (simulator or real vLLM)
    tap_url: str
    tap_metrics_url: str
    sim: Child | None = None  # the engine's process (a real vLLM's API server: its group holds the engine core)
    tap: Child | None = None
    vllm: VllmServer | None = None  # a real engine's handle (hang, resume, its processes)
    throttle: asyncio.Task | None = None  # a real engine's fault in progress (see LocalStack.throttle)


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
    async def __aenter__(self) -> Self:
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
        for e in self.engines:
            await self._end_throttle(e)
        await self.sup.stop()
        for e in self.engines:
            if e.vllm is not None:  # one still starting (not yet under the supervisor), or its log file
                await asyncio.get_running_loop().run_in_executor(None, e.vllm.stop)
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
        if spec.engine == VLLM:
            return self._spawn_vllm(spec)
        if spec.engine != SIM:
            raise StartError(f"engine {spec.name}: unknown engine kind {spec.engine!r} (sim or vllm)")
        sim_port, tap_port, tap_metrics_port = free_port(), free_port(), free_port()
        sim_argv = [sys.executable, "-m", "simulator.cli", "serve", "--host", "127.0.0.1", "--port", str(sim_port),
                    "--preset", spec.preset, "--model", spec.model, "--seed", str(len(self.engines))]
        if spec.lora:
            sim_argv += ["--lora", ",".join(spec.lora), "--max-loras", str(spec.max_loras)]
        if spec.gpu_memory_utilization:
            sim_argv += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
        procs = EngineProcs(spec, f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{tap_port}",
                            f"http://127.0.0.1:{tap_metrics_port}/metrics")
        procs.sim = sim = self.sup.spawn(f"sim-{spec.name}", sim_argv)
        tap = self._spawn_tap(procs, tap_port, tap_metrics_port)
        self.engines.append(procs)
        return [self.sup.wait_http(sim, procs.sim_url + "/health"), self.sup.wait_http(tap, procs.tap_metrics_url)]

    def _spawn_tap(self, procs: EngineProcs, tap_port: int, tap_metrics_port: int) -> Child:
        tap_argv = [sys.executable, "-m", "exporter.tap", "--listen", f"127.0.0.1:{tap_port}",
                    "--upstream", procs.sim_url, "--metrics-listen", f"127.0.0.1:{tap_metrics_port}",
                    "--log-level", "warning"]
        for p in self.settings.slo_paths:
            tap_argv += ["--slo", str(p)]
        procs.tap = tap = self.sup.spawn(f"tap-{procs.spec.name}", tap_argv)
        return tap

    def _spawn_vllm(self, spec: EngineSpec) -> list:
        """A real vLLM (realengine.vllm_server) where the simulator would be. It starts in a thread (the model is
        built on first use, the engine takes 30-60 s on two busy cores); once up, its API server joins the
        supervisor, so its process group (engine core and worker included) is checked and stopped with the rest."""
        why = vllm_server.available()
        if why:
            raise StartError(f"engine {spec.name}: the real engine cannot run here: {why}")
        tap_port, tap_metrics_port = free_port(), free_port()
        config = VllmConfig(served_name=spec.model, max_num_seqs=spec.max_num_seqs,
                            num_blocks=spec.kv_blocks or VllmConfig.num_blocks)
        self.sup.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.sup.log_dir / f"vllm-{spec.name}.log"
        server = VllmServer(config, log_path=log)
        procs = EngineProcs(spec, server.url, f"http://127.0.0.1:{tap_port}",
                            f"http://127.0.0.1:{tap_metrics_port}/metrics", vllm=server)
        tap = self._spawn_tap(procs, tap_port, tap_metrics_port)
        self.engines.append(procs)

        def start() -> None:
            server.model = server.model or vllm_server.model_dir()
            server.start(timeout=VLLM_START_TIMEOUT_S)

        async def up() -> None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, start)
            except RuntimeError as e:
                raise StartError(f"engine {spec.name} (vLLM): {e}; its log ({log}) ends:\n"
                                 f"{_tail(log)}") from None
            assert server.proc is not None
            procs.sim = Child(f"vllm-{spec.name}", server.started_argv, server.proc, log)
            self.sup.children.append(procs.sim)

        return [up(), self.sup.wait_http(tap, procs.tap_metrics_url)]

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
                if e.spec.engine == VLLM:  # the tiny model's own words (demo/realload.py)
                    records = await run_load(e.tap_url, spec, model=e.spec.model, session=session,
                                             render_prompt=realload.prompt_text)
                else:
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
        """Degrade one pool: a simulator through its admin fault API, e.g. {"slowdown": 30}; a real vLLM for
        real, by throttling its engine processes ({"slowdown": N, "period_s": P}: see `throttle`)."""
        engine = self.engine(name_or_class)
        if engine.vllm is not None:
            return await self.throttle(engine, float(fault["slowdown"]), float(fault.get("period_s", 0.3)))
        return await self.set_faults(engine, fault)

    async def recover(self, name_or_class: str) -> dict:
        engine = self.engine(name_or_class)
        if engine.vllm is not None:
            return await self._end_throttle(engine)
        return await self.set_faults(engine, {"reset": True})

    async def throttle(self, engine: EngineProcs, slowdown: float, period_s: float) -> dict:
        """Make a real vLLM run `slowdown` times slower, as a CPU quota does: its engine core and worker
        processes (the scheduler and the model; not the API server, which keeps answering /health and /metrics)
        run for period/slowdown seconds of every `period_s` and are stopped (SIGSTOP) for the rest, the way the
        kernel throttles a cgroup past its cpu.max quota. Every step, prefill and decode alike, takes its real
        time; requests simply get 1/slowdown of the wall clock."""
        assert engine.vllm is not None
        if not slowdown > 1 or not period_s > 0:
            raise ValueError(f"throttle: slowdown must be > 1 and period_s > 0 (got {slowdown}, {period_s})")
        await self._end_throttle(engine)
        pids = engine.vllm.processes("EngineCore") + engine.vllm.processes("Worker")
        if not pids:
            raise RuntimeError(f"{engine.spec.name}: no VLLM::EngineCore / VLLM::Worker process to throttle")
        run_s = period_s / slowdown

        def signal_all(sig: int) -> None:
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

        async def cycle() -> None:
            try:
                while True:
                    signal_all(signal.SIGCONT)
                    await asyncio.sleep(run_s)
                    signal_all(signal.SIGSTOP)
                    await asyncio.sleep(period_s - run_s)
            finally:
                signal_all(signal.SIGCONT)

        engine.throttle = asyncio.ensure_future(cycle())
        engine.throttle.pids = pids  # type: ignore[attr-defined]
        return {"slowdown": slowdown, "period_s": period_s, "run_s": run_s, "pids": pids}

    async def _end_throttle(self, engine: EngineProcs) -> dict:
        """Stop throttling a real engine (it runs at full speed again at once); {} when it was not throttled."""
        task, engine.throttle = engine.throttle, None
        if task is None:
            return {}
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # its finally: SIGCONT to every process
        return {"resumed": getattr(task, "pids", [])}

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


VLLM_START_TIMEOUT_S = 300.0  # a real engine's start, model build included, on two busy cores


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


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
                for r, o in zip(self.records, self.objectives, strict=True)]

    def good(self) -> int:
        return sum(self.good_flags())
