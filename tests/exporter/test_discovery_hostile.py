"""Discovery against hostile input: pods whose annotations try to point the exporter elsewhere, and
a real loopback HTTP server playing an API server (or proxy) that pages forever, floods items, answers
slowly or not at all. What must hold: no target leaves the pod's own IP and declared ports, a listing
ends within its bounds, the last good target list stays, and the metrics and one log line say why."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from exporter import discovery
from exporter.collector import Collector
from exporter.config import ConfigError, ExporterConfig, KubernetesDiscovery, load_config, merge_cli
from exporter.discovery import KubernetesDiscoverer
from exporter.exposition import render
from exporter.podtargets import REJECT_REASONS, targets_for_pod
from exporter.sources.http import new_session
from exporter.targets import TargetSet
from llmslo import conventions as c

NODE = "node-a"
ROOT = Path(__file__).resolve().parents[2]


def pod(name, *, annotations=None, ports=({"containerPort": 8000},), ip="10.0.0.5", node=NODE, host_network=False,
        ns="llm", kind="vllm"):
    spec = {"nodeName": node, "containers": [{"name": "engine", "ports": list(ports)}]}
    if host_network:
        spec["hostNetwork"] = True
    return {"metadata": {"name": name, "namespace": ns, "labels": {"llmslo.io/engine": kind},
                         "annotations": {"llmslo.io/metrics-port": "8000", **(annotations or {})}},
            "spec": spec, "status": {"phase": "Running", "podIP": ip}}


# ---------------------------------------------------------------------------------------------- annotations
HOSTILE = [
    # (annotations or pod changes, the reason, the key named in the log)
    ({"llmslo.io/metrics-scheme": "file"}, "scheme", "llmslo.io/metrics-scheme"),
    ({"llmslo.io/metrics-scheme": "file:///etc/passwd?"}, "scheme", "llmslo.io/metrics-scheme"),
    ({"llmslo.io/metrics-scheme": "http://169.254.169.254/latest/meta-data?"}, "scheme", "llmslo.io/metrics-scheme"),
    ({"prometheus.io/scheme": "gopher"}, "scheme", "prometheus.io/scheme"),
    ({"llmslo.io/metrics-path": "//evil.example/metrics"}, "path", "llmslo.io/metrics-path"),
    ({"llmslo.io/metrics-path": "/\\evil.example/metrics"}, "path", "llmslo.io/metrics-path"),
    ({"llmslo.io/metrics-path": "@evil.example/metrics"}, "path", "llmslo.io/metrics-path"),
    ({"llmslo.io/metrics-path": "/metrics#@evil.example"}, "path", "llmslo.io/metrics-path"),
    ({"llmslo.io/metrics-path": "/metrics?x=@evil.example:80"}, "path", "llmslo.io/metrics-path"),
    ({"llmslo.io/metrics-path": "/a/../../admin"}, "path", "llmslo.io/metrics-path"),
    ({"llmslo.io/metrics-path": "/%2e%2e/admin"}, "path", "llmslo.io/metrics-path"),
    ({"llmslo.io/metrics-path": "/" + "a" * 300}, "path", "llmslo.io/metrics-path"),
    ({"prometheus.io/path": "http://evil.example/metrics"}, "path", "prometheus.io/path"),
    ({"llmslo.io/metrics-port": "10250"}, "undeclared_port", "llmslo.io/metrics-port"),  # the kubelet
    ({"llmslo.io/metrics-port": "8000@evil.example"}, "port", "llmslo.io/metrics-port"),
    ({"llmslo.io/metrics-port": "0"}, "port", "llmslo.io/metrics-port"),
    ({"llmslo.io/metrics-port": "\u00b2"}, "port", "llmslo.io/metrics-port"),  # str.isdigit() says yes
    ({"llmslo.io/metrics-port": 8000}, "malformed", "llmslo.io/metrics-port"),  # not a string
]


@pytest.mark.parametrize(("annotations", "reason", "key"), HOSTILE, ids=[repr(a) for a, _, _ in HOSTILE])
def test_an_annotation_cannot_point_a_target_elsewhere(annotations, reason, key):
    found = targets_for_pod(pod("p", annotations=annotations), KubernetesDiscovery(enabled=True))
    assert found.targets == ()
    [rejection] = found.rejections
    assert (rejection.reason, rejection.key) == (reason, key)


def test_a_pods_ip_must_be_its_own_and_not_the_nodes():
    settings = KubernetesDiscovery(enabled=True)
    [bad_ip] = targets_for_pod(pod("p", ip="evil.example"), settings).rejections
    assert bad_ip.reason == "pod_ip"
    [host] = targets_for_pod(pod("p", host_network=True), settings).rejections
    assert host.reason == "host_network"
    allowed = targets_for_pod(pod("p", host_network=True), KubernetesDiscovery(enabled=True, allow_host_network=True))
    assert [t.url for t in allowed.targets] == ["http://10.0.0.5:8000/metrics"]


def test_what_a_pod_may_choose_it_still_chooses():
    settings = KubernetesDiscovery(enabled=True, allowed_ports=(9100,))
    ok = targets_for_pod(pod("p", annotations={"llmslo.io/metrics-scheme": "HTTPS", "llmslo.io/metrics-path": "/v1/metrics?format=text",
                                               "llmslo.io/tap-port": "9100"}), settings)
    assert ok.rejections == ()
    assert [t.url for t in ok.targets] == ["https://10.0.0.5:8000/v1/metrics?format=text", "http://10.0.0.5:9100/metrics"]
    sidecar = pod("p", annotations={"llmslo.io/tap-port": "9402"})
    sidecar["spec"]["initContainers"] = [{"name": "tap", "restartPolicy": "Always", "ports": [{"containerPort": 9402}]}]
    assert [t.url for t in targets_for_pod(sidecar, settings).targets][1:] == ["http://10.0.0.5:9402/metrics"]
    # An undeclared tap port loses the tap target only, and says so.
    bad_tap = targets_for_pod(pod("p", annotations={"llmslo.io/tap-port": "10250"}), settings)
    assert [t.kind for t in bad_tap.targets] == ["vllm"]
    assert [(r.reason, r.key) for r in bad_tap.rejections] == [("undeclared_port", "llmslo.io/tap-port")]


class PodApi:
    """A real HTTP server answering pod lists the way the test tells it to; records each request."""

    def __init__(self, pods):
        self.pods = pods
        self.mode = "good"
        self.requests = 0

    async def handler(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        n = int(request.query.get("continue") or 0)
        if self.mode == "good":
            return web.json_response({"kind": "PodList", "items": self.pods, "metadata": {}})
        if self.mode == "endless":  # a continue token on every page, forever
            return web.json_response({"items": [pod(f"other-{n}-{i}", node="node-b") for i in range(5)],
                                      "metadata": {"continue": str(n + 1)}})
        if self.mode == "flood":  # one page with far more pods than any node runs, limit ignored
            return web.json_response({"items": [{"metadata": {"name": f"p{i}"}} for i in range(50_000)], "metadata": {}})
        if self.mode == "huge":  # one page over the byte cap
            return web.Response(body=b'{"items": [' + b'{},' * 6_000_000 + b'{}]}', content_type="application/json")
        if self.mode == "slow":  # every page takes a while, and there is always one more
            await asyncio.sleep(0.2)
            return web.json_response({"items": [], "metadata": {"continue": str(n + 1)}})
        await asyncio.sleep(3600)  # "hang": accept and never answer
        raise AssertionError


async def _with_api(http_server, pods, body):
    api = PodApi(pods)
    runner, base = await http_server({"/api/v1/pods": api.handler, "/api/v1/namespaces/{ns}/pods": api.handler})
    try:
        return await body(api, base)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("mode", "reason", "max_requests"), [
    ("endless", "max_pages", 100), ("flood", "max_items", 1), ("huge", "page_bytes", 1),
    ("slow", "listing_timeout", 10), ("hang", "listing_timeout", 1),
])
def test_a_hostile_api_server_ends_the_listing_and_the_last_good_targets_stay(http_server, tmp_path, caplog, mode, reason,
                                                                               max_requests):
    good = [pod("vllm-0")]

    async def body(api, base):
        settings = KubernetesDiscovery(enabled=True, api_server=base, service_account_dir=str(tmp_path),
                                       listing_timeout_s=1.0 if mode in ("slow", "hang") else 30.0)
        discoverer = KubernetesDiscoverer(settings, NODE)
        targets = TargetSet((), discoverer, refresh_s=30)
        try:
            await targets.refresh()
            before, asked, last_success = targets.current(), api.requests, getattr(discoverer, "last_success", None)
            api.mode = mode
            await asyncio.wait_for(targets.refresh(), 15)  # before the bounds: never returned (endless, slow)
            return before, targets.current(), api.requests - asked, last_success, discoverer.last_success, targets.self_metrics()
        finally:
            await discoverer.close()

    with caplog.at_level("WARNING", logger="llmslo.exporter"):
        before, after, requests, success_before, success_after, metrics = asyncio.run(_with_api(http_server, good, body))
    assert [t.url for t in before] == ["http://10.0.0.5:8000/metrics"]
    assert after == before  # the last good list stays
    assert requests <= max_requests if mode != "endless" else requests == max_requests
    assert success_after == success_before > 0
    abandoned = {s.labels["reason"]: s.value for s in metrics if s.metric is c.EXPORTER_DISCOVERY_ABANDONED}
    assert abandoned == {r: (1.0 if r == reason else 0.0) for r in abandoned} and reason in abandoned
    [line] = [r.getMessage() for r in caplog.records if "discovery_failed" in r.getMessage()]
    assert f"reason={reason}" in line


def test_a_pod_pointing_elsewhere_is_never_fetched_and_is_counted(http_server, tmp_path, caplog):
    """The attack end to end: a pod's scheme annotation aims at another server on the network (here a
    loopback one holding a "secret" page); the exporter must not ask it, and must say which pod did what."""
    secret_page = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="secret"} 42\n'
    asked_secret = []

    async def secret(request):
        asked_secret.append(request.path)
        return web.Response(body=secret_page, content_type="text/plain")

    async def body(api, base):
        secret_runner, secret_base = await http_server({"/metrics": secret})
        api.pods = [pod("evil-0", annotations={"llmslo.io/metrics-scheme": f"{secret_base}/metrics?"}),
                    pod("evil-1", annotations={"llmslo.io/metrics-path": "/x", "llmslo.io/metrics-port": "10250"})]
        discoverer = KubernetesDiscoverer(KubernetesDiscovery(enabled=True, api_server=base, service_account_dir=str(tmp_path)), NODE)
        targets = TargetSet((), discoverer, refresh_s=30)
        try:
            async with new_session() as session:
                await targets.refresh()
                await targets.refresh()  # a second listing: counted again, logged once
                snap = await Collector(ExporterConfig(gpu="off"), session, None, NODE).collect(targets.current())
                return targets.current(), snap, getattr(targets, "self_metrics", list)()
        finally:
            await discoverer.close()
            await secret_runner.cleanup()

    with caplog.at_level("WARNING", logger="llmslo.exporter"):
        found, snap, metrics = asyncio.run(_with_api(http_server, [], body))
    assert found == [] and asked_secret == []
    assert not [s for s in snap.samples if s.metric is c.REQUESTS_RUNNING]
    page = render(metrics).decode()
    assert 'llm_exporter_discovery_rejected_total{reason="scheme"} 2' in page
    assert 'llm_exporter_discovery_rejected_total{reason="undeclared_port"} 2' in page
    assert {f'llm_exporter_discovery_rejected_total{{reason="{r}"}}' for r in REJECT_REASONS} <= {
        line.rsplit(" ", 1)[0] for line in page.splitlines()}
    lines = [r.getMessage() for r in caplog.records if "discovery_rejected_pod" in r.getMessage()]
    assert len(lines) == 2  # one line per pod and reason, not one per listing
    assert "pod=llm/evil-0 annotation=llmslo.io/metrics-scheme reason=scheme" in lines[0]
    assert "pod=llm/evil-1 annotation=llmslo.io/metrics-port reason=undeclared_port" in lines[1]


# ---------------------------------------------------------------------------------------------- --once, memory
class _EndlessPages(BaseHTTPRequestHandler):
    """Pages of 500 pods (about 1 MB) with a continue token, forever: a stdlib server, another thread."""

    served = 0
    bytes_served = 0
    page = json.dumps({"items": [pod(f"other-{i}", node="node-b", annotations={"pad": "x" * 1500}) for i in range(500)],
                       "metadata": {"continue": "more"}}).encode()

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        type(self).served += 1
        type(self).bytes_served += len(self.page)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args):
        pass


def test_once_ends_against_endless_pages_and_its_memory_stays_bounded(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessPages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(f"gpu: off\nnode_name: {NODE}\nkubernetes_discovery:\n  enabled: true\n"
                   f"  api_server: http://127.0.0.1:{server.server_address[1]}\n  service_account_dir: {tmp_path}\n"
                   "  max_items: 1000000\n  max_pages: 300\n")  # so the page bound is the one reached, 260 MiB in
    # The child reports its own peak RSS; an address-space cap turns the unbounded growth this guards
    # against into a quick failure instead of a machine-wide one.
    probe = ("import resource, sys\nfrom exporter.cli import main\nrc = main(sys.argv[1:])\n"
             "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(rc)\n")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    try:
        proc = subprocess.run([sys.executable, "-c", probe, "--config", str(cfg), "--once"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, preexec_fn=cap)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 1, proc.stderr[-2000:]  # nothing to scrape, said on stderr; it ended
    assert "discovery_failed" in proc.stderr and "reason=max_pages" in proc.stderr
    assert _EndlessPages.served == 300
    peak_mib = int(proc.stderr.rsplit("peak_rss_kib", 1)[1].split()[0]) / 1024
    served_mib = _EndlessPages.bytes_served / 2**20
    print(f"--once against endless pages: {_EndlessPages.served} pages, {served_mib:.0f} MiB served, peak RSS {peak_mib:.0f} MiB")
    # One page at a time (about 1 MB, some 5 MB parsed), not all of them: alone the peak is about 50 MiB
    # at 20, 100 or 300 pages; holding every page would pass 1 GiB here (before the bounds: 3 GiB in 20 s).
    assert served_mib > 250
    assert peak_mib < 250


# ---------------------------------------------------------------------------------------------- the namespaces setting
def test_discovery_namespaces_is_a_flag_and_is_checked(tmp_path):
    merged = merge_cli(ExporterConfig(), discovery_namespaces=["llm,batch", "llm"])
    assert merged.discovery.namespaces == ("llm", "batch")
    with pytest.raises(ConfigError, match=r"--discovery-namespaces 'Bad_NS'.*namespace name"):
        merge_cli(ExporterConfig(), discovery_namespaces=["Bad_NS"])
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text("kubernetes_discovery:\n  namespaces: [llm, ../etc]\n")
    with pytest.raises(ConfigError, match=r"kubernetes_discovery\.namespaces: '\.\./etc' is not a namespace name"):
        load_config(cfg)
    cfg.write_text("kubernetes_discovery:\n  namespaces: []\n  allowed_ports: [8000]\n  max_pages: 5\n  listing_timeout: 2s\n")
    d = load_config(cfg).discovery
    assert (d.namespaces, d.allowed_ports, d.max_pages, d.listing_timeout_s) == ((), (8000,), 5, 2.0)


def test_the_cli_refuses_a_bad_namespace_with_exit_2():
    proc = subprocess.run([sys.executable, "-m", "exporter", "--discovery-namespaces", "llm,UPPER", "--once"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--discovery-namespaces" in proc.stderr and "'UPPER' is not a namespace name" in proc.stderr


def test_a_discovered_pod_cannot_redirect_the_exporter_elsewhere(http_server, tmp_path):
    """The pod's own /metrics answers 302 to another server: the exporter does not follow it."""
    asked_secret = []

    async def secret(request):
        asked_secret.append(request.path)
        return web.Response(body=b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="s"} 42\n',
                            content_type="text/plain")

    async def body(api, base):
        secret_runner, secret_base = await http_server({"/metrics": secret})

        async def redirect(request):
            raise web.HTTPFound(f"{secret_base}/metrics")

        engine_runner, engine_base = await http_server({"/metrics": redirect})
        port = int(engine_base.rsplit(":", 1)[1])
        api.pods = [pod("redirecting-0", ip="127.0.0.1", annotations={"llmslo.io/metrics-port": str(port)},
                        ports=[{"containerPort": port}])]
        discoverer = KubernetesDiscoverer(KubernetesDiscovery(enabled=True, api_server=base, service_account_dir=str(tmp_path)), NODE)
        targets = TargetSet((), discoverer, refresh_s=30)
        try:
            async with new_session() as session:
                await targets.refresh()
                return await Collector(ExporterConfig(gpu="off"), session, None, NODE).collect(targets.current())
        finally:
            await discoverer.close()
            await engine_runner.cleanup()
            await secret_runner.cleanup()

    snap = asyncio.run(_with_api(http_server, [], body))
    assert asked_secret == []
    assert [(t.up, t.reason) for t in snap.targets] == [(False, "http_302")]
    assert not [s for s in snap.samples if s.metric is c.REQUESTS_RUNNING]


# ---------------------------------------------------------------------------------------------- one page, memory
def _manifest_memory_limit() -> int:
    """The exporter container's `resources.limits.memory` in the shipped DaemonSet, in bytes."""
    doc = yaml.safe_load((ROOT / "slogen/kustomize/base/daemonset.yaml").read_text())
    [container] = [k for k in doc["spec"]["template"]["spec"]["containers"] if k["name"] == "exporter"]
    quantity = container["resources"]["limits"]["memory"]
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]]


def _just_under_the_cap(head: bytes, unit: bytes, tail: bytes) -> bytes:
    """head + unit*n + tail, as large as the exporter's page cap still accepts."""
    n = (discovery.MAX_PAGE_BYTES - len(head) - len(tail)) // len(unit)
    return head + unit * n + tail


def _hostile_page(mode: str) -> bytes:
    if mode == "at_the_value_bound":  # as many `{}` pods as the value count lets through to the parser
        return b'{"items":[' + b"{}," * (discovery.MAX_PAGE_VALUES // 2 - 8) + b"{}]}"
    if mode == "tiny_items":  # millions of `{}` pods: each costs some 30 times its 3 bytes once parsed
        return _just_under_the_cap(b'{"kind":"PodList","metadata":{},"items":[', b"{},", b"{}]}")
    # three pods, each with a huge annotation object of empty objects: few items, the same parsed weight
    head, tail = b'{"metadata":{"name":"h","annotations":{"x":[', b"{}]}}}"
    item = head + b"{}," * ((discovery.MAX_PAGE_BYTES // 3 - 64 - len(head) - len(tail)) // 3) + tail
    return b'{"kind":"PodList","metadata":{},"items":[' + b",".join([item] * 3) + b"]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _abandoned(metrics_page: str, reason: str) -> float:
    for line in metrics_page.splitlines():
        if line.startswith(f'{c.EXPORTER_DISCOVERY_ABANDONED.name}{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(("mode", "reason", "other"), [
    ("tiny_items", c.ABANDONED_BYTES, c.ABANDONED_ITEMS), ("huge_items", c.ABANDONED_BYTES, c.ABANDONED_ITEMS),
    ("at_the_value_bound", c.ABANDONED_ITEMS, c.ABANDONED_BYTES),
])
def test_one_hostile_page_under_the_byte_cap_is_refused_and_memory_stays_under_the_manifest_limit(tmp_path, mode, reason,
                                                                                                   other):
    """A page under the byte cap whose parse would cost hundreds of MiB (very many tiny items, or few
    huge ones): the serving exporter refuses it, listing after listing, keeps answering /metrics, and
    its peak RSS stays under the DaemonSet's memory limit (past it the kubelet OOM-kills the exporter)."""
    body = _hostile_page(mode)
    assert len(body) <= discovery.MAX_PAGE_BYTES

    class Hostile(_EndlessPages):
        served = 0
        page = body

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = _free_port()
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(f"gpu: off\nnode_name: {NODE}\nkubernetes_discovery:\n  enabled: true\n"
                   f"  api_server: http://127.0.0.1:{server.server_address[1]}\n  service_account_dir: {tmp_path}\n"
                   "  refresh_interval: 1s\n")
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--config", str(cfg), "--web.listen-address", f"127.0.0.1:{port}"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        page, deadline = "", time.monotonic() + 90
        while _abandoned(page, reason) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            with contextlib.suppress(OSError):
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        alive = proc.poll() is None
    finally:
        proc.terminate()
        stderr = proc.communicate(timeout=30)[1]
        server.shutdown()
        server.server_close()
    peak = int(status.split("VmHWM:")[1].split()[0]) * 1024
    limit = _manifest_memory_limit()
    held = max(float(d.split()[0]) for d in stderr.split("duration_s=")[1:])
    print(f"{mode}: {len(body) / 2**20:.1f} MiB page, the longest listing {held} s, served {Hostile.served} times, peak RSS {peak / 2**20:.0f} MiB "
          f"(limit {limit / 2**20:.0f} MiB)")
    assert alive, stderr[-2000:]
    assert _abandoned(page, reason) >= 3, stderr[-2000:]  # refused, listing after listing, and /metrics answered
    assert _abandoned(page, other) == 0
    assert f"{c.EXPORTER_DISCOVERY_LAST_SUCCESS.name} 0" in page.splitlines()
    assert peak < limit
