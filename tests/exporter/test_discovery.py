"""Kubernetes discovery against a fake API server: a real HTTPS peer on loopback, reached the way
a pod reaches the real one (KUBERNETES_SERVICE_HOST/PORT, the service-account token and CA)."""

from __future__ import annotations

import asyncio
import shutil
import ssl

import pytest
from aiohttp import web

from exporter.collector import Collector
from exporter.config import ExporterConfig, KubernetesDiscovery, TargetConfig, load_config
from exporter.discovery import DiscoveryError, KubernetesDiscoverer
from exporter.snapshot import CollectionLoop, SnapshotHolder
from exporter.sources.http import new_session
from exporter.targets import TargetSet
from llmslo import conventions as c

NODE = "node-a"
TOKEN = "sa-token-123"
ENGINE_LABEL = "llmslo.io/engine"


def pod(name, kind="vllm", *, ns="llm", phase="Running", ip="10.0.0.5", annotations=None, ports=None,
        node=NODE, deleting=False):
    meta = {"name": name, "namespace": ns, "labels": {ENGINE_LABEL: kind} if kind else {},
            "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status = {"phase": phase}
    if ip:
        status["podIP"] = ip
    containers = [{"name": "engine", "ports": ports or []}]
    return {"metadata": meta, "spec": {"nodeName": node, "containers": containers}, "status": status}


PODS = [
    pod("vllm-0", annotations={"llmslo.io/metrics-port": "8000", "llmslo.io/model": "llama-3-8b",
                               "llmslo.io/tap-port": "9402"},
        ports=[{"containerPort": 8000}, {"name": "tap-metrics", "containerPort": 9402}]),
    pod("sglang-0", "sglang", annotations={"prometheus.io/port": "30000", "prometheus.io/path": "/custom/metrics",
                                           "prometheus.io/scheme": "https"}, ports=[{"containerPort": 30000}]),
    pod("tgi-0", "tgi", ns="other", ports=[{"name": "http", "containerPort": 80}, {"name": "metrics", "containerPort": 9000}]),
    pod("pending-0", phase="Pending", annotations={"llmslo.io/metrics-port": "8000"}),
    pod("noip-0", ip="", annotations={"llmslo.io/metrics-port": "8000"}),
    pod("terminating-0", deleting=True, annotations={"llmslo.io/metrics-port": "8000"}),
    pod("badkind-0", "llama", annotations={"llmslo.io/metrics-port": "8000"}),
    pod("noport-0", ports=[{"containerPort": 1}, {"containerPort": 2}]),
    pod("v6-0", "auto", ip="fd00::5", annotations={"llmslo.io/metrics-port": "8000", "llmslo.io/metrics-path": "stats"},
        ports=[{"containerPort": 8000}]),
    pod("elsewhere-0", node="node-b", annotations={"llmslo.io/metrics-port": "8000"}),
]

EXPECTED = [
    TargetConfig(kind="vllm", url="http://10.0.0.5:8000/metrics", name="llm/vllm-0:8000", model="llama-3-8b",
                 pod="vllm-0", namespace="llm"),
    TargetConfig(kind="tap", url="http://10.0.0.5:9402/metrics", name="llm/vllm-0:9402", model="llama-3-8b",
                 pod="vllm-0", namespace="llm"),
    TargetConfig(kind="sglang", url="https://10.0.0.5:30000/custom/metrics", name="llm/sglang-0:30000",
                 pod="sglang-0", namespace="llm"),
    TargetConfig(kind="tgi", url="http://10.0.0.5:9000/metrics", name="other/tgi-0:9000", pod="tgi-0", namespace="other"),
    TargetConfig(kind="auto", url="http://[fd00::5]:8000/stats", name="llm/v6-0:8000", pod="v6-0", namespace="llm"),
]


class FakeApiServer:
    """Serves pod lists in pages of 4, records what it was asked, can be told to refuse."""

    def __init__(self, pods):
        self.pods = pods
        self.requests: list[tuple[str, dict, str]] = []
        self.status = 200
        self.hang = False  # True: accept requests and never answer (an overloaded API server)

    async def pods_handler(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.query), request.headers.get("Authorization", "")))
        if self.hang:
            await asyncio.sleep(3600)
        if self.status != 200:
            return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
        start = int(request.query.get("continue") or 0)
        items = [p for p in self.pods if request.match_info.get("ns", p["metadata"]["namespace"]) == p["metadata"]["namespace"]]
        page = items[start:start + 4]
        more = start + 4 < len(items)
        return web.json_response({"kind": "PodList", "items": page,
                                  "metadata": {"continue": str(start + 4) if more else ""}})


@pytest.fixture
def in_cluster(tmp_path, certs, monkeypatch, http_server):
    """Start the fake API server over TLS and point the in-cluster environment at it."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN + "\n")
    shutil.copy(certs["ca_crt"], sa / "ca.crt")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certs["server_crt"]), str(certs["server_key"]))
    api = FakeApiServer(PODS)

    async def start(runners):
        runner, base = await http_server({"/api/v1/pods": api.pods_handler,
                                          "/api/v1/namespaces/{ns}/pods": api.pods_handler}, ssl_context=ctx)
        port = base.rsplit(":", 1)[1]
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
        runners.append(runner)

    settings = KubernetesDiscovery(enabled=True, service_account_dir=str(sa))
    return api, settings, start


def run_with_api(start, body):
    async def go():
        runners: list = []
        await start(runners)
        try:
            return await body()
        finally:
            for r in runners:
                await r.cleanup()

    return asyncio.run(go())


def test_discovers_engine_pods_on_this_node_with_ports_paths_and_models(in_cluster, caplog):
    api, settings, start = in_cluster
    discoverer = KubernetesDiscoverer(settings, NODE)

    async def body():
        try:
            return await discoverer.discover()
        finally:
            await discoverer.close()

    with caplog.at_level("WARNING"):
        targets = run_with_api(start, body)
    assert targets == sorted(EXPECTED, key=lambda t: t.label)
    assert len(api.requests) == 3  # 10 pods in pages of 4, followed through `continue`
    for path, query, auth in api.requests:
        assert path == "/api/v1/pods"
        assert query["fieldSelector"] == f"spec.nodeName={NODE}"
        assert query["labelSelector"] == ENGINE_LABEL
        assert auth == f"Bearer {TOKEN}"
    assert [q.get("continue") for _, q, _ in api.requests] == [None, "4", "8"]
    assert "badkind-0" in caplog.text and "noport-0" in caplog.text  # skipped pods are logged with why


def test_namespace_filter_lists_each_namespace(in_cluster):
    api, settings, start = in_cluster
    discoverer = KubernetesDiscoverer(KubernetesDiscovery(**{**settings.__dict__, "namespaces": ("other", "batch")}), NODE)

    async def body():
        try:
            return await discoverer.discover()
        finally:
            await discoverer.close()

    targets = run_with_api(start, body)
    assert [t.label for t in targets] == ["other/tgi-0:9000"]
    assert [p for p, _, _ in api.requests] == ["/api/v1/namespaces/other/pods", "/api/v1/namespaces/batch/pods"]


def test_a_refusing_api_server_keeps_the_last_good_targets(in_cluster, caplog):
    api, settings, start = in_cluster
    discoverer = KubernetesDiscoverer(settings, NODE)
    targets = TargetSet((), discoverer, refresh_s=0)

    async def body():
        try:
            await targets.refresh()
            first = targets.current()
            api.status = 403
            with pytest.raises(DiscoveryError, match="get, list on pods"):
                await discoverer.discover()
            await targets.refresh()
            return first, targets.current()
        finally:
            await discoverer.close()

    with caplog.at_level("WARNING"):
        first, after = run_with_api(start, body)
    assert len(first) == len(EXPECTED) and after == first
    assert "discovery_failed" in caplog.text


def test_outside_a_cluster_discovery_says_so(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    discoverer = KubernetesDiscoverer(KubernetesDiscovery(enabled=True, service_account_dir=str(tmp_path)), NODE)
    with pytest.raises(DiscoveryError, match="not in a cluster"):
        asyncio.run(discoverer.discover())


async def _engine_pod(api, http_server, model: str, running: int, *paths: str) -> tuple[web.AppRunner, str]:
    """A vLLM page with `running` requests of `model`, served at `paths` on loopback, and the API server listing
    it as pod llm/local-0 with the metrics-port annotation: (the engine's runner, its base URL)."""
    page = (b"# TYPE vllm:num_requests_running gauge\n"
            + f'vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}.0\n'.encode())

    async def metrics(request):
        return web.Response(body=page, content_type="text/plain")

    runner, base = await http_server(dict.fromkeys(paths, metrics))
    port = base.rsplit(":", 1)[1]
    api.pods = [pod("local-0", ip="127.0.0.1", annotations={"llmslo.io/metrics-port": port},
                    ports=[{"containerPort": int(port)}])]
    return runner, base


def test_discovered_pods_are_scraped_with_their_identity(in_cluster, http_server):
    api, settings, start = in_cluster

    async def body():
        engine_runner, base = await _engine_pod(api, http_server, "served-model", 5, "/metrics")
        discoverer = KubernetesDiscoverer(settings, NODE)
        try:
            async with new_session() as session:
                targets = TargetSet((), discoverer, refresh_s=30)
                await targets.refresh()
                collector = Collector(ExporterConfig(), session, None, NODE)
                return await collector.collect(targets.current())
        finally:
            await discoverer.close()
            await engine_runner.cleanup()

    snap = run_with_api(start, body)
    [running] = [s for s in snap.samples if s.metric.name == c.REQUESTS_RUNNING.name]
    assert running.value == 5
    assert {k: running.labels[k] for k in ("engine", "model", "pod", "namespace", "node")} == {
        "engine": "vllm", "model": "served-model", "pod": "local-0", "namespace": "llm", "node": NODE}


def test_a_hung_api_server_never_delays_a_cycle(in_cluster, http_server, caplog):
    api, settings, start = in_cluster

    async def body():
        engine_runner, base = await _engine_pod(api, http_server, "m", 2, "/metrics", "/static")
        port = base.rsplit(":", 1)[1]
        static = (TargetConfig(kind="vllm", url=f"{base}/static", name="static", pod="static-0"),)
        discoverer = KubernetesDiscoverer(settings, NODE)
        targets = TargetSet(static, discoverer, refresh_s=0)
        try:
            async with new_session() as session:
                await targets.refresh()  # one good list
                api.hang = True
                asked = len(api.requests)
                await targets.start()  # refreshes at once, in the background, into the hung server
                while len(api.requests) == asked:
                    await asyncio.sleep(0.01)
                loop = CollectionLoop(Collector(ExporterConfig(), session, None, NODE), targets, SnapshotHolder(), 5.0)
                t0 = asyncio.get_running_loop().time()
                published = await asyncio.wait_for(loop.run_once(), 3.0)  # discovery's own timeout is 10 s
                return published.snapshot, asyncio.get_running_loop().time() - t0, port
        finally:
            await targets.stop()
            await discoverer.close()
            await engine_runner.cleanup()

    with caplog.at_level("INFO", logger="llmslo.exporter"):
        snap, took, port = run_with_api(start, body)
    assert took < 2.0
    assert {t.target: t.up for t in snap.targets} == {"static": True, f"llm/local-0:{port}": True}  # the last good list
    assert sorted(s.labels["pod"] for s in snap.samples if s.metric.name == c.REQUESTS_RUNNING.name) == ["local-0", "static-0"]
    assert "event=discovery_changed targets=1 duration_s=" in caplog.text


def test_discovery_settings_load_from_the_config_file(tmp_path):
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(
        "node_name: node-a\n"
        "kubernetes_discovery:\n  enabled: true\n  namespaces: [llm]\n  refresh_interval: 1m\n"
        "  port_annotation: example.com/port\n"
    )
    d = load_config(cfg).discovery
    assert d.enabled and d.namespaces == ("llm",) and d.refresh_interval_s == 60
    assert d.port_annotation == "example.com/port" and d.engine_label == ENGINE_LABEL
