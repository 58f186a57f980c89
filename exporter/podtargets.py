"""A discovered pod -> the scrape targets it may have: what the exporter trusts of a pod, and what not.

Anyone who can create or annotate a pod carrying the engine label (in a watched namespace) controls
its annotations, so an annotation may only choose among the pod's own endpoints, never a place:

  host    always the pod's own IP from its status (set by the kubelet, not by the pod's author);
          a hostNetwork pod's IP is the node's, shared with the kubelet and every host daemon, so
          such pods are refused unless `allow_host_network` is set
  port    a port the pod declares (a container port, native sidecars included) or one of the
          operator's `allowed_ports`; 1-65535, digits only
  scheme  http or https; never file:// (local files), never anything else
  path    a plain absolute path of safe characters (`stats` is read as `/stats`), bounded: no authority (`//`), no `..`,
          no backslash, `@`, `#`, `%` or `:`, an optional query of safe characters

The whole URL is then parsed back and must name exactly that scheme, host and port. A refused pod
gets no target; the caller logs the pod, the annotation and the reason, and counts the reason.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from exporter.config import TARGET_KINDS, KubernetesDiscovery, TargetConfig

PROMETHEUS_PORT = "prometheus.io/port"
PROMETHEUS_PATH = "prometheus.io/path"
PROMETHEUS_SCHEME = "prometheus.io/scheme"
DEFAULT_PATH = "/metrics"
SCHEMES = ("http", "https")
MAX_PATH_CHARS = 256  # engines serve /metrics; 256 leaves room for a prefix and a short query
_PATH = re.compile(r"/[A-Za-z0-9._~/-]*(\?[A-Za-z0-9._~=&-]*)?")
_PORT = re.compile(r"[0-9]{1,5}")

# The `reason` label of llm_exporter_discovery_rejected_total, in this order.
ENGINE_LABEL = "engine_label"
MALFORMED = "malformed"
POD_IP = "pod_ip"
HOST_NETWORK = "host_network"
PORT = "port"
UNDECLARED_PORT = "undeclared_port"
SCHEME = "scheme"
PATH = "path"
REJECT_REASONS = (ENGINE_LABEL, MALFORMED, POD_IP, HOST_NETWORK, PORT, UNDECLARED_PORT, SCHEME, PATH)


@dataclass(frozen=True)
class Rejection:
    """Why one target of a pod was refused: the reason label, the key at fault, a short explanation."""

    reason: str
    key: str
    why: str


@dataclass(frozen=True)
class PodTargets:
    targets: tuple[TargetConfig, ...]
    rejections: tuple[Rejection, ...]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def is_candidate(pod: dict[str, Any], node_name: str) -> bool:
    """Running, with an IP, not terminating, on this node: the pods worth judging at all."""
    meta, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    if status.get("phase") != "Running" or not status.get("podIP") or meta.get("deletionTimestamp"):
        return False
    # The field selector already filters by node; this guards a misbehaving API server or proxy.
    return _dict(pod.get("spec")).get("nodeName", node_name) == node_name


def declared_ports(pod: dict[str, Any]) -> list[tuple[str, int]]:
    """(name, containerPort) of every container and native sidecar (restartPolicy Always) of the pod."""
    spec = _dict(pod.get("spec"))
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    containers += [c for c in spec.get("initContainers") or [] if isinstance(c, dict) and c.get("restartPolicy") == "Always"]
    out = []
    for ctr in containers:
        for p in ctr.get("ports") or []:
            if isinstance(p, dict) and isinstance(p.get("containerPort"), int) and not isinstance(p["containerPort"], bool):
                out.append((_text(p.get("name")), p["containerPort"]))
    return out


def _default_port(ports: list[tuple[str, int]]) -> str:
    """The container port named "metrics", else the pod's only port; "" when ambiguous."""
    for name, number in ports:
        if name == "metrics":
            return str(number)
    return str(ports[0][1]) if len(ports) == 1 else ""


def check_port(value: str, key: str, ports: list[tuple[str, int]], allowed: tuple[int, ...]) -> Rejection | None:
    if not _PORT.fullmatch(value) or not 1 <= int(value) <= 65535:
        return Rejection(PORT, key, f"{value[:40]!r} is not a port number (1-65535)")
    if int(value) not in {n for _, n in ports} and int(value) not in allowed:
        return Rejection(UNDECLARED_PORT, key, f"port {value} is not a container port of the pod nor in allowed_ports")
    return None


def check_path(value: str, key: str) -> Rejection | None:
    if len(value) > MAX_PATH_CHARS:
        return Rejection(PATH, key, f"longer than {MAX_PATH_CHARS} characters")
    shown = value[:60]
    if not _PATH.fullmatch(value) or "//" in value:
        return Rejection(PATH, key, f"{shown!r} is not a plain absolute path (/ then letters, digits, . _ ~ - /)")
    if ".." in value.split("?", 1)[0].split("/"):
        return Rejection(PATH, key, f"{shown!r} has a .. segment")
    return None


def _url(scheme: str, ip: str, port: str, path: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"{scheme}://{host}:{port}{path}"


def _points_at(url: str, scheme: str, ip: str, port: str) -> bool:
    """The built URL, parsed back, names exactly this scheme, host and port (defence in depth)."""
    try:
        parts = urlsplit(url)
        return parts.scheme == scheme and parts.hostname == ip.lower() and parts.port == int(port) \
            and not parts.username and not parts.password
    except ValueError:
        return False


def targets_for_pod(pod: dict[str, Any], s: KubernetesDiscovery) -> PodTargets:
    """The pod's targets (engine, and tap when annotated) and the refusals; call only for candidates."""
    meta, spec, status = _dict(pod.get("metadata")), _dict(pod.get("spec")), _dict(pod.get("status"))
    name, namespace = _text(meta.get("name")), _text(meta.get("namespace"))
    labels, annotations = _dict(meta.get("labels")), _dict(meta.get("annotations"))
    if not name or not namespace:
        return PodTargets((), (Rejection(MALFORMED, "metadata", "the pod has no name or namespace"),))
    kind = _text(labels.get(s.engine_label)) or _text(annotations.get(s.engine_label))
    if kind not in TARGET_KINDS:
        return PodTargets((), (Rejection(ENGINE_LABEL, s.engine_label, f"{kind[:40]!r} is not one of {', '.join(TARGET_KINDS)}"),))
    ip = _text(status.get("podIP"))
    try:
        ip = str(ipaddress.ip_address(ip))
    except ValueError:
        return PodTargets((), (Rejection(POD_IP, "status.podIP", f"{ip[:60]!r} is not an IP address"),))
    if spec.get("hostNetwork") is True and not s.allow_host_network:
        return PodTargets((), (Rejection(HOST_NETWORK, "spec.hostNetwork",
                                         "its IP is the node's; set allow_host_network to scrape such pods"),))

    def annotation(own: str, prometheus: str) -> tuple[str, str | None]:
        for key in (own, prometheus):
            if key in annotations:
                return key, annotations[key] if isinstance(annotations[key], str) else None
        return "", ""

    ports = declared_ports(pod)
    port_key, port = annotation(s.port_annotation, PROMETHEUS_PORT)
    path_key, path = annotation(s.path_annotation, PROMETHEUS_PATH)
    scheme_key, scheme = annotation(s.scheme_annotation, PROMETHEUS_SCHEME)
    for key, value in ((port_key, port), (path_key, path), (scheme_key, scheme)):
        if value is None:
            return PodTargets((), (Rejection(MALFORMED, key, "the annotation is not a string"),))
    assert port is not None and path is not None and scheme is not None
    if not port:
        port_key, port = "spec.containers[].ports", _default_port(ports)
        if not port:
            return PodTargets((), (Rejection(PORT, s.port_annotation, "no metrics port: set the annotation or name a container port `metrics`"),))
    rejected = check_port(port, port_key, ports, s.allowed_ports)
    if rejected is None and scheme.lower() not in ("", *SCHEMES):
        rejected = Rejection(SCHEME, scheme_key, f"{scheme[:20]!r} is not http or https")
    if path and not path.startswith("/"):
        path = "/" + path  # `metrics` means /metrics, as before; `//host` stays refused below
    if rejected is None and path:
        rejected = check_path(path, path_key)
    scheme, path = scheme.lower() or "http", path or DEFAULT_PATH
    url = _url(scheme, ip, port, path)
    if rejected is None and not _points_at(url, scheme, ip, port):
        rejected = Rejection(PATH, path_key or "url", "the URL would not name the pod's own address")
    if rejected is not None:
        return PodTargets((), (rejected,))
    model = _text(annotations.get(s.model_annotation))
    out = [TargetConfig(kind=kind, url=url, name=f"{namespace}/{name}:{port}", model=model, pod=name, namespace=namespace)]
    tap_port = annotations.get(s.tap_port_annotation)
    if tap_port is None or tap_port == port:
        return PodTargets(tuple(out), ())
    if not isinstance(tap_port, str):
        return PodTargets(tuple(out), (Rejection(MALFORMED, s.tap_port_annotation, "the annotation is not a string"),))
    tap_rejected = check_port(tap_port, s.tap_port_annotation, ports, s.allowed_ports)
    if tap_rejected is not None:
        return PodTargets(tuple(out), (tap_rejected,))
    out.append(TargetConfig(kind="tap", url=_url("http", ip, tap_port, DEFAULT_PATH), name=f"{namespace}/{name}:{tap_port}",
                            model=model, pod=name, namespace=namespace))
    return PodTargets(tuple(out), ())
