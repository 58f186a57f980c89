"""Kubernetes discovery: the engine pods running on this node, from the API server.

The exporter runs as a DaemonSet, so it lists only pods with `spec.nodeName=<this node>` and
the engine label, using the pod's service account (token re-read each time: projected tokens
rotate). Pod metadata it reads, all names configurable:

  label      llmslo.io/engine: vllm|sglang|tgi|trtllm-triton|trtllm-serve|llamacpp|tap|auto   (required)
  annotation llmslo.io/metrics-port   (else prometheus.io/port, else the container port named
                                       "metrics", else the pod's only container port)
  annotation llmslo.io/metrics-path   (else prometheus.io/path, else /metrics)
  annotation llmslo.io/metrics-scheme (else prometheus.io/scheme, else http)
  annotation llmslo.io/model          (model label when the page does not name it)
  annotation llmslo.io/tap-port       (a goodput tap sidecar's metrics port: adds a `tap` target)

Only Running pods with an IP that are not terminating become targets.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from exporter import logs
from exporter.config import TARGET_KINDS, KubernetesDiscovery, TargetConfig

PROMETHEUS_PORT = "prometheus.io/port"
PROMETHEUS_PATH = "prometheus.io/path"
PROMETHEUS_SCHEME = "prometheus.io/scheme"
PAGE_LIMIT = 500
REQUEST_TIMEOUT_S = 10.0


class DiscoveryError(Exception):
    """The API server could not be asked or refused; the message says what to check."""


class KubernetesDiscoverer:
    def __init__(self, settings: KubernetesDiscovery, node_name: str):
        self.settings = settings
        self.node_name = node_name
        self._session: aiohttp.ClientSession | None = None
        self._skipped: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ API access
    def api_base(self) -> str:
        if self.settings.api_server:
            return self.settings.api_server.rstrip("/")
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise DiscoveryError(
                "not in a cluster: KUBERNETES_SERVICE_HOST is unset (set kubernetes_discovery.api_server to reach one from outside)"
            )
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def _headers(self) -> dict[str, str]:
        token_file = Path(self.settings.service_account_dir) / "token"
        try:
            token = token_file.read_text().strip()
        except OSError:
            if self.settings.api_server:
                return {}  # e.g. kubectl proxy: no token needed
            raise DiscoveryError(f"cannot read the service-account token {token_file}") from None
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def _session_for_api(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ca = Path(self.settings.service_account_dir) / "ca.crt"
            ssl_ctx: ssl.SSLContext | bool = True
            if ca.exists():
                ssl_ctx = ssl.create_default_context(cafile=str(ca))
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=4),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _list_urls(self) -> list[str]:
        base = self.api_base()
        query = f"fieldSelector={quote('spec.nodeName=' + self.node_name, safe='')}&limit={PAGE_LIMIT}"
        if self.settings.label_selector:
            query += f"&labelSelector={quote(self.settings.label_selector, safe='')}"
        if not self.settings.namespaces:
            return [f"{base}/api/v1/pods?{query}"]
        return [f"{base}/api/v1/namespaces/{quote(ns, safe='')}/pods?{query}" for ns in self.settings.namespaces]

    async def list_pods(self) -> list[dict[str, Any]]:
        session = self._session_for_api()
        pods: list[dict[str, Any]] = []
        for url in self._list_urls():
            cont = ""
            while True:
                page_url = url + (f"&continue={quote(cont, safe='')}" if cont else "")
                try:
                    async with session.get(page_url, headers=self._headers()) as resp:
                        if resp.status in (401, 403):
                            raise DiscoveryError(
                                f"API server answered HTTP {resp.status}: the exporter's service account needs "
                                "get, list on pods (ClusterRole) bound to it"
                            )
                        if resp.status != 200:
                            raise DiscoveryError(f"API server answered HTTP {resp.status} listing pods")
                        body = await resp.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    raise DiscoveryError(f"listing pods failed: {type(exc).__name__}") from None
                pods.extend(body.get("items") or [])
                cont = (body.get("metadata") or {}).get("continue") or ""
                if not cont:
                    break
        return pods

    # ------------------------------------------------------------------ pods -> targets
    async def discover(self) -> list[TargetConfig]:
        targets: list[TargetConfig] = []
        for pod in await self.list_pods():
            targets.extend(self.targets_for_pod(pod))
        return sorted(targets, key=lambda t: t.label)

    def targets_for_pod(self, pod: dict[str, Any]) -> list[TargetConfig]:
        s = self.settings
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        name, namespace = meta.get("name", ""), meta.get("namespace", "")
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or meta.get("deletionTimestamp"):
            return []
        if (pod.get("spec") or {}).get("nodeName", self.node_name) != self.node_name:
            return []  # the field selector already filters; this guards a misbehaving proxy
        kind = labels.get(s.engine_label) or annotations.get(s.engine_label, "")
        if kind not in TARGET_KINDS:
            self._skip(namespace, name, f"engine label {s.engine_label}={kind!r} is not one of {', '.join(TARGET_KINDS)}")
            return []
        port = annotations.get(s.port_annotation) or annotations.get(PROMETHEUS_PORT) or _container_port(pod)
        if not port or not str(port).isdigit():
            self._skip(namespace, name, f"no metrics port: set annotation {s.port_annotation}")
            return []
        path = annotations.get(s.path_annotation) or annotations.get(PROMETHEUS_PATH) or "/metrics"
        scheme = annotations.get(s.scheme_annotation) or annotations.get(PROMETHEUS_SCHEME) or "http"
        host = f"[{ip}]" if ":" in ip else ip
        model = annotations.get(s.model_annotation, "")
        out = [TargetConfig(
            kind=kind, url=f"{scheme}://{host}:{port}/{path.lstrip('/')}", name=f"{namespace}/{name}:{port}",
            model=model, pod=name, namespace=namespace,
        )]
        tap_port = annotations.get(s.tap_port_annotation)
        if tap_port and str(tap_port).isdigit() and tap_port != str(port):
            out.append(TargetConfig(
                kind="tap", url=f"http://{host}:{tap_port}/metrics", name=f"{namespace}/{name}:{tap_port}",
                model=model, pod=name, namespace=namespace,
            ))
        return out

    def _skip(self, namespace: str, name: str, why: str) -> None:
        if len(self._skipped) > 10_000:  # pod churn must not grow this forever
            self._skipped.clear()
        if (f"{namespace}/{name}", why) not in self._skipped:  # log once per pod and reason
            self._skipped.add((f"{namespace}/{name}", why))
            logs.event("discovery_skipped_pod", logging.WARNING, pod=f"{namespace}/{name}", reason=why)


def _container_port(pod: dict[str, Any]) -> str:
    """The container port named "metrics", else the pod's only port; "" when ambiguous."""
    ports = [p for ctr in (pod.get("spec") or {}).get("containers") or [] for p in ctr.get("ports") or []]
    for p in ports:
        if p.get("name") == "metrics" and p.get("containerPort"):
            return str(p["containerPort"])
    if len(ports) == 1 and ports[0].get("containerPort"):
        return str(ports[0]["containerPort"])
    return ""
