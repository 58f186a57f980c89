"""What the injector does to one pod: a pure function from the pod to JSON Patch operations (RFC 6902), or to
the reason it is left alone.

How the serving port is routed through the tap, and why this way. A Service (or a router, or a NetworkPolicy)
that names the engine's port by NAME (`targetPort: http`) keeps its meaning with no edit: the tap takes that
name, on a port of its own (`llmslo.io/tap-listen-port`, default 8001), and the engine's port is renamed
`engine`, its number unchanged. The engine's command line, its port and its probes' numbers are not touched
(a probe that named the port is pointed at the new name, so it still reaches the engine itself), and the tap
relays to 127.0.0.1:<the engine's port>. Other ways were worse: moving the engine to another port means
editing each engine's own flags (`--port`, `--http-port`, ...), and redirecting packets (iptables) needs
NET_ADMIN, which the serving floor refuses. What the name cannot reach, a client that dials the engine's
NUMBER (a Service with `targetPort: 8000`, production-stack's router with `--k8s-port 8000`), still goes to
the engine directly: docs/deploy.md says what to set for each.

Everything a pod's author controls here (the annotations) is checked, and a bad value leaves the pod
unchanged with a reason and a warning the author sees in `kubectl apply`, never a half-injected pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# The opt-in and opt-out: the pod's own label, or its namespace's (the webhook's namespaceSelector).
LABEL_TAP = "llmslo.io/tap"
ENABLED, DISABLED = "enabled", "disabled"
NAMESPACE_LABEL = "llmslo.io/tap-injection"
# Annotations a pod may set (each optional), and the one the injector sets.
ANNOTATION_INJECTED = "llmslo.io/tap-injected"
ANNOTATION_PORT_NAME = "llmslo.io/tap-port-name"  # the port the tap takes over (default: --port-name, `http`)
ANNOTATION_LISTEN_PORT = "llmslo.io/tap-listen-port"  # where the tap listens (default 8001)
ANNOTATION_ENGINE_PORT = "llmslo.io/engine-port"  # where the engine listens, if not the named port's number
ANNOTATION_SLO_CONFIGMAP = "llmslo.io/tap-slo-configmap"  # the SLO ConfigMap (default: --slo-configmap)
# The exporter's discovery reads these (exporter/config.py: KubernetesDiscovery, the same keys): the tap's
# metrics port, the engine's metrics port and the label that makes a pod a target.
ANNOTATION_TAP_METRICS_PORT = "llmslo.io/tap-port"
ANNOTATION_METRICS_PORT = "llmslo.io/metrics-port"
ANNOTATION_PROMETHEUS_PORT = "prometheus.io/port"
LABEL_ENGINE = "llmslo.io/engine"
ENGINE_AUTO = "auto"

TAP_CONTAINER = "llmslo-tap"
TAP_VOLUME = "llmslo-tap-slos"
TAP_METRICS_PORT_NAME = "tap-metrics"
ENGINE_PORT_NAME = "engine"  # the engine's port, renamed: its number stays
SLO_MOUNT = "/etc/llmslo/slos"
TAP_UID = 65532  # the image's user (deploy/Dockerfile)

# Skip reasons: the label values of llm_tap_injector_skipped_total{reason}, a fixed set.
SKIP_NOT_OPTED_IN = "not_opted_in"
SKIP_OPTED_OUT = "opted_out"
SKIP_ALREADY_INJECTED = "already_injected"
SKIP_NOT_A_POD = "not_a_pod"
SKIP_NOT_CREATE = "not_create"
SKIP_MALFORMED = "malformed"
SKIP_NO_SERVING_PORT = "no_serving_port"
SKIP_PORT_CONFLICT = "port_conflict"
SKIP_NAME_CONFLICT = "name_conflict"
SKIP_BAD_ANNOTATION = "bad_annotation"
SKIP_HOST_NETWORK = "host_network"
SKIP_REASONS = (
    SKIP_NOT_OPTED_IN, SKIP_OPTED_OUT, SKIP_ALREADY_INJECTED, SKIP_NOT_A_POD, SKIP_NOT_CREATE, SKIP_MALFORMED,
    SKIP_NO_SERVING_PORT, SKIP_PORT_CONFLICT, SKIP_NAME_CONFLICT, SKIP_BAD_ANNOTATION, SKIP_HOST_NETWORK,
)

# Kubernetes' own name rules (apimachinery validation: IsValidPortName, IsDNS1123Subdomain).
_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DIGEST_IMAGE = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class InjectorSettings:
    """The injector's own settings (its flags); a pod's annotations override the ports and the ConfigMap."""

    tap_image: str  # by digest: what runs in every injected pod is exactly what was reviewed
    slo_configmap: str = "llmslo-slos"
    port_name: str = "http"
    listen_port: int = 8001
    metrics_port: int = 9402
    shutdown_grace_s: int = 30
    cpu_request: str = "250m"
    memory_request: str = "128Mi"
    cpu_limit: str = "1"
    memory_limit: str = "256Mi"

    def problems(self) -> list[str]:
        """What is wrong with these settings, each naming its flag (empty when they are usable)."""
        out = []
        if not _DIGEST_IMAGE.match(self.tap_image) or self.tap_image.endswith("@sha256:" + "0" * 64):
            out.append(f"--tap-image {self.tap_image!r}: give the llmslo image by digest, "
                       "REGISTRY/NAME@sha256:<64 hex> (not a tag, not the all-zero placeholder)")
        if _subdomain_problem(self.slo_configmap):
            out.append(f"--slo-configmap {self.slo_configmap!r}: {_subdomain_problem(self.slo_configmap)}")
        if _port_name_problem(self.port_name):
            out.append(f"--port-name {self.port_name!r}: {_port_name_problem(self.port_name)}")
        for flag, port in (("--listen-port", self.listen_port), ("--metrics-port", self.metrics_port)):
            if not 1 <= port <= 65535:
                out.append(f"{flag} {port}: a port is 1-65535")
        if self.listen_port == self.metrics_port:
            out.append("--listen-port and --metrics-port: the tap needs two different ports")
        return out


@dataclass(frozen=True)
class Plan:
    """The operations to apply, or the reason there are none (and what to tell the pod's author)."""

    ops: tuple[dict[str, Any], ...] = ()
    skipped: str = ""
    warnings: tuple[str, ...] = field(default=())


def skip(reason: str, warning: str = "") -> Plan:
    return Plan(skipped=reason, warnings=(f"llmslo tap not injected: {warning}",) if warning else ())


def _port_name_problem(name: str) -> str:
    if not _PORT_NAME.match(name) or "--" in name or not re.search("[a-z]", name):
        return "a port name is 1-15 lowercase letters, digits and single inner hyphens, with a letter"
    return ""


def _subdomain_problem(name: str) -> str:
    if len(name) > 253 or not _SUBDOMAIN.match(name):
        return "a ConfigMap name is a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"
    return ""


def pointer(*parts: str | int) -> str:
    """A JSON Pointer (RFC 6901): `~` and `/` inside a part escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


@dataclass(frozen=True)
class Ports:
    """Where each part listens, once the pod's annotations are read."""

    name: str  # the port name the tap takes over
    engine_container: int  # index in spec.containers
    engine_port_index: int  # index in that container's ports
    engine: int
    listen: int
    metrics: int
    configmap: str


def _annotation_port(annotations: dict[str, Any], key: str, default: int) -> int | str:
    """The port an annotation gives (or the default); a text saying what is wrong otherwise."""
    value = annotations.get(key)
    if value is None:
        return default
    # ASCII and at most 5 digits before int(): `²` is a digit to isdigit() and 5,000 digits exceed int()'s limit,
    # and either would raise, counting the author's typo as the injector's own failure
    if not isinstance(value, str) or not (value.isascii() and value.isdigit() and len(value) <= 5) \
            or not 1 <= int(value) <= 65535:
        return f"annotation {key}={str(value)[:20]!r} is not a port (1-65535)"
    return int(value)


def _declared_ports(containers: list[dict[str, Any]]) -> list[tuple[int, int, dict[str, Any]]]:
    """(container index, port index, port) of every declared container port."""
    out = []
    for i, c in enumerate(containers):
        ports = c.get("ports") or []
        if not isinstance(ports, list):
            continue
        out += [(i, j, p) for j, p in enumerate(ports) if isinstance(p, dict)]
    return out


def _read_ports(pod: dict[str, Any], settings: InjectorSettings) -> Ports | Plan:
    annotations = pod["metadata"].get("annotations") or {}
    name = annotations.get(ANNOTATION_PORT_NAME, settings.port_name)
    if not isinstance(name, str) or _port_name_problem(name):
        return skip(SKIP_BAD_ANNOTATION, f"annotation {ANNOTATION_PORT_NAME}={str(name)[:20]!r}: "
                    f"{_port_name_problem(str(name))}")
    configmap = annotations.get(ANNOTATION_SLO_CONFIGMAP, settings.slo_configmap)
    if not isinstance(configmap, str) or _subdomain_problem(configmap):
        return skip(SKIP_BAD_ANNOTATION, f"annotation {ANNOTATION_SLO_CONFIGMAP}: {_subdomain_problem(str(configmap))}")
    declared = _declared_ports(pod["spec"]["containers"])
    named = [(i, j, p) for i, j, p in declared if p.get("name") == name]
    if len(named) != 1 or not isinstance(named[0][2].get("containerPort"), int):
        return skip(SKIP_NO_SERVING_PORT, f"no container declares one port named {name!r} "
                    f"(name the engine's serving port, or set the annotation {ANNOTATION_PORT_NAME})")
    i, j, port = named[0]
    found = {key: _annotation_port(annotations, key, default) for key, default in (
        (ANNOTATION_ENGINE_PORT, port["containerPort"]), (ANNOTATION_LISTEN_PORT, settings.listen_port),
        (ANNOTATION_TAP_METRICS_PORT, settings.metrics_port))}
    bad = [v for v in found.values() if isinstance(v, str)]
    if bad:
        return skip(SKIP_BAD_ANNOTATION, bad[0])
    engine, listen, metrics = (int(found[k]) for k in (
        ANNOTATION_ENGINE_PORT, ANNOTATION_LISTEN_PORT, ANNOTATION_TAP_METRICS_PORT))
    return Ports(name, i, j, engine, listen, metrics, configmap)


def _conflict(pod: dict[str, Any], ports: Ports) -> Plan | None:
    """A port number or a name the tap needs that the pod already uses (its containers share one network)."""
    spec = pod["spec"]
    numbers = {p.get("containerPort") for _, _, p in _declared_ports(spec["containers"])}
    numbers.add(ports.engine)
    if ports.listen == ports.metrics:
        return skip(SKIP_PORT_CONFLICT, f"the tap's listen and metrics ports are both {ports.listen}")
    for what, number in (("listen", ports.listen), ("metrics", ports.metrics)):
        if number in numbers:
            return skip(SKIP_PORT_CONFLICT, f"the tap's {what} port {number} is taken in the pod "
                        f"(set the annotation {ANNOTATION_LISTEN_PORT} or {ANNOTATION_TAP_METRICS_PORT})")
    names = {p.get("name") for _, _, p in _declared_ports(spec["containers"])}
    for taken in (ENGINE_PORT_NAME, TAP_METRICS_PORT_NAME):
        if taken in names:
            return skip(SKIP_NAME_CONFLICT, f"the pod already has a port named {taken!r}")
    if any(isinstance(v, dict) and v.get("name") == TAP_VOLUME for v in spec.get("volumes") or []):
        return skip(SKIP_NAME_CONFLICT, f"the pod already has a volume named {TAP_VOLUME!r}")
    return None


def already_injected(pod: dict[str, Any]) -> bool:
    """The injector's mark, or a tap already there (by this webhook, or added by hand as in
    slogen/kustomize/examples/inference: a container running `tap`)."""
    if ANNOTATION_INJECTED in (pod["metadata"].get("annotations") or {}):
        return True
    return any(isinstance(c, dict) and (c.get("name") == TAP_CONTAINER or (c.get("args") or [None])[:1] == ["tap"])
               for c in pod["spec"]["containers"] + (pod["spec"].get("initContainers") or []))


def well_formed(pod: Any) -> bool:
    """Enough of a pod to patch: metadata and spec objects, containers a non-empty list of objects."""
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict) or not isinstance(pod.get("spec"), dict):
        return False
    meta, spec = pod["metadata"], pod["spec"]
    containers = spec.get("containers")
    return (isinstance(containers, list) and bool(containers) and all(isinstance(c, dict) for c in containers)
            and isinstance(meta.get("labels") or {}, dict) and isinstance(meta.get("annotations") or {}, dict)
            and isinstance(spec.get("volumes") or [], list) and isinstance(spec.get("initContainers") or [], list))


def plan(pod: Any, namespace_opted_in: bool, settings: InjectorSettings) -> Plan:
    """The operations that inject the tap into `pod` (a Pod object as the API server sends it on CREATE), or
    why not. `namespace_opted_in`: the pod reached the webhook through its namespace's label, so no pod label is
    needed; the pod label `disabled` still opts out."""
    if not well_formed(pod):
        return skip(SKIP_MALFORMED)
    label = (pod["metadata"].get("labels") or {}).get(LABEL_TAP)
    if label == DISABLED:
        return skip(SKIP_OPTED_OUT)
    if label != ENABLED and not namespace_opted_in:
        return skip(SKIP_NOT_OPTED_IN)
    if already_injected(pod):
        return skip(SKIP_ALREADY_INJECTED)
    if pod["spec"].get("hostNetwork") is True:  # the tap's ports would be the node's, shared by every such pod
        return skip(SKIP_HOST_NETWORK, "the pod uses the node's network (hostNetwork): the tap's ports would be "
                    "the node's; run the engine on the pod network")
    ports = _read_ports(pod, settings)
    if isinstance(ports, Plan):
        return ports
    conflict = _conflict(pod, ports)
    if conflict is not None:
        return conflict
    return Plan(ops=tuple(_operations(pod, ports, settings)))


def tap_container(ports: Ports, settings: InjectorSettings) -> dict[str, Any]:
    """The sidecar, with the security floor (non-root, read-only root, no capability, no escalation, the
    runtime's seccomp profile) and bounded resources; its arguments are the tap's own (exporter/tap/options.py)."""
    return {
        "name": TAP_CONTAINER,
        "image": settings.tap_image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["tap", "--listen", f"0.0.0.0:{ports.listen}", "--upstream", f"http://127.0.0.1:{ports.engine}",
                 "--metrics-listen", f"0.0.0.0:{ports.metrics}", "--slo", SLO_MOUNT,
                 "--shutdown-grace", str(settings.shutdown_grace_s)],
        "ports": [{"name": ports.name, "containerPort": ports.listen, "protocol": "TCP"},
                  {"name": TAP_METRICS_PORT_NAME, "containerPort": ports.metrics, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": ports.listen}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": settings.cpu_request, "memory": settings.memory_request},
                      "limits": {"cpu": settings.cpu_limit, "memory": settings.memory_limit}},
        "securityContext": {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "runAsUser": TAP_UID, "runAsGroup": TAP_UID, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": TAP_VOLUME, "mountPath": SLO_MOUNT, "readOnly": True}],
    }


def _probe_ops(container: dict[str, Any], index: int, name: str) -> list[dict[str, Any]]:
    """The engine's probes and lifecycle hooks that named the port, pointed at its new name (a named port is
    looked up in the probed container's own ports: left as it was, it would no longer resolve)."""
    ops = []
    for hook_path, hook in [((k,), container.get(k)) for k in ("startupProbe", "readinessProbe", "livenessProbe")] + [
            (("lifecycle", k), (container.get("lifecycle") or {}).get(k)) for k in ("postStart", "preStop")]:
        if not isinstance(hook, dict):
            continue
        for kind in ("httpGet", "tcpSocket"):
            action = hook.get(kind)
            if isinstance(action, dict) and action.get("port") == name:
                ops.append({"op": "replace", "path": pointer("spec", "containers", index, *hook_path, kind, "port"),
                            "value": ENGINE_PORT_NAME})
    return ops


def _annotation_ops(pod: dict[str, Any], ports: Ports) -> list[dict[str, Any]]:
    meta = pod["metadata"]
    annotations = meta.get("annotations") or {}
    wanted = {ANNOTATION_INJECTED: "true", ANNOTATION_TAP_METRICS_PORT: str(ports.metrics)}
    if ANNOTATION_METRICS_PORT not in annotations and ANNOTATION_PROMETHEUS_PORT not in annotations:
        wanted[ANNOTATION_METRICS_PORT] = str(ports.engine)  # the exporter's fallback (the pod's only port) is gone
    ops: list[dict[str, Any]] = []
    if "annotations" not in meta or meta["annotations"] is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": wanted})
    else:
        ops += [{"op": "add", "path": pointer("metadata", "annotations", k), "value": v} for k, v in wanted.items()]
    if LABEL_ENGINE not in (meta.get("labels") or {}):  # the exporter finds the tap's metrics by this label
        if meta.get("labels") is None:
            ops.append({"op": "add", "path": "/metadata/labels", "value": {LABEL_ENGINE: ENGINE_AUTO}})
        else:
            ops.append({"op": "add", "path": pointer("metadata", "labels", LABEL_ENGINE), "value": ENGINE_AUTO})
    return ops


def _operations(pod: dict[str, Any], ports: Ports, settings: InjectorSettings) -> list[dict[str, Any]]:
    spec = pod["spec"]
    engine = spec["containers"][ports.engine_container]
    ops = _annotation_ops(pod, ports)
    ops.append({"op": "replace", "value": ENGINE_PORT_NAME,
                "path": pointer("spec", "containers", ports.engine_container, "ports", ports.engine_port_index, "name")})
    ops += _probe_ops(engine, ports.engine_container, ports.name)
    ops.append({"op": "add", "path": "/spec/containers/-", "value": tap_container(ports, settings)})
    volume = {"name": TAP_VOLUME, "configMap": {"name": ports.configmap}}
    if spec.get("volumes") is None:
        ops.append({"op": "add", "path": "/spec/volumes", "value": [volume]})
    else:
        ops.append({"op": "add", "path": "/spec/volumes/-", "value": volume})
    return ops


__all__ = ["InjectorSettings", "Plan", "already_injected", "plan", "pointer", "tap_container"]
