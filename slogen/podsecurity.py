"""Pod Security Standards, checked before the API server does: every pod template a rendered install holds,
against the levels of the namespace it lands in.

Why here: the API server's Pod Security admission refuses a pod whose namespace `enforce`s a level the pod
breaks, and only when the pod is created, so a DaemonSet that cannot run applies cleanly and then never
starts a pod. This module evaluates the same controls offline, on kustomize's output, at the newest policy
version (POLICY_RELEASE); it is proved on Kubernetes' own admission fixtures (tests/deploy/test_pod_security.py).

A namespace's levels come from its `pod-security.kubernetes.io/{enforce,warn,audit}` labels when the
manifests hold the Namespace; a namespace they do not hold (yours: `monitoring`, say) is assumed to enforce
`restricted`, the strictest level a cluster may set, so what passes here runs wherever it is put.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

POLICY_RELEASE = "v1.37"  # the controls below are those of this version (k8s.io/pod-security-admission/policy)
LEVELS = ("privileged", "baseline", "restricted")
MODES = ("enforce", "warn", "audit")
LABEL_PREFIX = "pod-security.kubernetes.io/"

_BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
_SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"})
_RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                       "persistentVolumeClaim", "projected", "secret")
_PROFILE_TYPES = ("RuntimeDefault", "Localhost")  # seccomp and AppArmor alike
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_POD_TEMPLATE_PATHS = {
    "Pod": (), "Deployment": ("spec", "template"), "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"), "DaemonSet": ("spec", "template"), "Job": ("spec", "template"),
    "ReplicationController": ("spec", "template"), "CronJob": ("spec", "jobTemplate", "spec", "template")}


@dataclass(frozen=True)
class Violation:
    control: str  # the control's ID in the Pod Security Standards (e.g. hostPathVolumes)
    detail: str


@dataclass(frozen=True)
class Finding:
    """One workload breaking the level one of its namespace's modes names."""

    workload: str  # Kind namespace/name
    namespace: str
    mode: str  # enforce (the pod is refused), warn (the client is told), audit (the audit log records it)
    level: str
    violations: tuple[Violation, ...]

    def line(self) -> str:
        outcome = {"enforce": "refused", "warn": "warned", "audit": "audited"}[self.mode]
        reasons = "; ".join(f"{v.control}: {v.detail}" for v in self.violations)
        return f"{outcome}: {self.workload} breaks {self.level}:{POLICY_RELEASE} ({self.mode}): {reasons}"


Pod = tuple[dict, dict]  # (metadata, spec)
Control = Callable[[dict, dict], "str | None"]


def _sc(obj: dict) -> dict:
    return obj.get("securityContext") or {}


def _containers(spec: dict) -> Iterator[dict]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _names(items: Iterable[dict]) -> str:
    return ", ".join(f'"{c.get("name", "")}"' for c in items)


def _windows(spec: dict) -> bool:
    return (spec.get("os") or {}).get("name") == "windows"


def _user_namespace(spec: dict) -> bool:
    return spec.get("hostUsers") is False


def _bad(containers: list[dict], what: str) -> str | None:
    return f"{'container' if len(containers) == 1 else 'containers'} {_names(containers)} {what}" if containers else None


# ------------------------------------------------------------------------------------------------ baseline
def windows_host_process(meta: dict, spec: dict) -> str | None:
    bad = [o for o in [spec, *_containers(spec)] if (_sc(o).get("windowsOptions") or {}).get("hostProcess") is True]
    return "pod or containers must not set securityContext.windowsOptions.hostProcess=true" if bad else None


def host_namespaces(meta: dict, spec: dict) -> str | None:
    used = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k) is True]
    return ", ".join(used) if used else None


def privileged(meta: dict, spec: dict) -> str | None:
    return _bad([c for c in _containers(spec) if _sc(c).get("privileged") is True],
                "must not set securityContext.privileged=true")


def capabilities_baseline(meta: dict, spec: dict) -> str | None:
    bad = [c for c in _containers(spec) if set((_sc(c).get("capabilities") or {}).get("add") or []) - _BASELINE_CAPABILITIES]
    return _bad(bad, "must not add capabilities beyond the default set")


def host_path_volumes(meta: dict, spec: dict) -> str | None:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    return f"hostPath volumes {', '.join(bad)}" if bad else None


def host_ports(meta: dict, spec: dict) -> str | None:
    bad = [c for c in _containers(spec) if any(p.get("hostPort") not in (None, 0) for p in c.get("ports") or [])]
    return _bad(bad, "use hostPort")


def _hosts(handler: dict | None) -> list[str]:
    handler = handler or {}
    return [h for kind in ("httpGet", "tcpSocket") if (h := (handler.get(kind) or {}).get("host"))]


def host_probes_and_lifecycle(meta: dict, spec: dict) -> str | None:
    bad = []
    for c in _containers(spec):
        lifecycle = c.get("lifecycle") or {}
        handlers = [c.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        if any(_hosts(h) for h in handlers + [lifecycle.get("postStart"), lifecycle.get("preStop")]):
            bad.append(c)
    return _bad(bad, "set a probe or lifecycle host")


def app_armor_profile(meta: dict, spec: dict) -> str | None:
    profiles = [p for o in [spec, *_containers(spec)] if (p := _sc(o).get("appArmorProfile")) is not None]
    bad = [str(p.get("type")) for p in profiles if p.get("type") not in _PROFILE_TYPES]
    bad += [f"{k}={v}" for k, v in sorted((meta.get("annotations") or {}).items())
            if k.startswith(_APPARMOR_ANNOTATION) and v and v != "runtime/default" and not str(v).startswith("localhost/")]
    return f"forbidden AppArmor profile {', '.join(bad)}" if bad else None


def _bad_selinux(opts: dict | None) -> bool:
    return opts is not None and (opts.get("type") or "") not in _SELINUX_TYPES or bool(
        opts and (opts.get("user") or opts.get("role")))


def selinux_options(meta: dict, spec: dict) -> str | None:
    bad = [o for o in [spec, *_containers(spec)] if _bad_selinux(_sc(o).get("seLinuxOptions"))]
    return "forbidden securityContext.seLinuxOptions (a type outside container_t, container_init_t, " \
           "container_kvm_t, container_engine_t, or a user or role)" if bad else None


def _proc_mount(meta: dict, spec: dict) -> str | None:
    return _bad([c for c in _containers(spec) if _sc(c).get("procMount") not in (None, "Default")],
                 "must not set securityContext.procMount other than Default")


def proc_mount_baseline(meta: dict, spec: dict) -> str | None:
    return None if _user_namespace(spec) else _proc_mount(meta, spec)


def _seccomp_type(obj: dict) -> str | None:
    profile = _sc(obj).get("seccompProfile")
    return None if profile is None else str(profile.get("type"))


def seccomp_baseline(meta: dict, spec: dict) -> str | None:
    bad = [t for o in [spec, *_containers(spec)] if (t := _seccomp_type(o)) is not None and t not in _PROFILE_TYPES]
    return f"securityContext.seccompProfile.type must not be {', '.join(bad)}" if bad else None


def sysctls(meta: dict, spec: dict) -> str | None:
    bad = [s.get("name", "") for s in _sc(spec).get("sysctls") or [] if s.get("name") not in _SAFE_SYSCTLS]
    return f"forbidden sysctls {', '.join(bad)}" if bad else None


# ---------------------------------------------------------------------------------------------- restricted
def restricted_volumes(meta: dict, spec: dict) -> str | None:
    bad = [v.get("name", "") for v in spec.get("volumes") or []  # no source at all: the API server's default, emptyDir
           if set(v) - {"name"} and not any(v.get(kind) is not None for kind in _RESTRICTED_VOLUMES)]
    return f"volumes {', '.join(bad)} use a type outside {', '.join(_RESTRICTED_VOLUMES)}" if bad else None


def allow_privilege_escalation(meta: dict, spec: dict) -> str | None:
    if _windows(spec):
        return None
    return _bad([c for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False],
                "must set securityContext.allowPrivilegeEscalation=false")


def run_as_non_root(meta: dict, spec: dict) -> str | None:
    if _user_namespace(spec):
        return None
    pod = _sc(spec).get("runAsNonRoot")
    explicit = [c for c in _containers(spec) if _sc(c).get("runAsNonRoot") is False]
    if pod is False or explicit:
        return "pod or containers must not set securityContext.runAsNonRoot=false"
    implicit = [c for c in _containers(spec) if _sc(c).get("runAsNonRoot") is None and pod is not True]
    return _bad(implicit, "(or the pod) must set securityContext.runAsNonRoot=true")


def run_as_user(meta: dict, spec: dict) -> str | None:
    if _user_namespace(spec):
        return None
    bad = [o for o in [spec, *_containers(spec)] if _sc(o).get("runAsUser") == 0]
    return "pod or containers must not set securityContext.runAsUser=0" if bad else None


def seccomp_restricted(meta: dict, spec: dict) -> str | None:
    if _windows(spec):
        return None
    explicit = seccomp_baseline(meta, spec)
    if explicit:
        return explicit
    pod_set = _seccomp_type(spec) is not None
    implicit = [c for c in _containers(spec) if _seccomp_type(c) is None and not pod_set]
    return _bad(implicit, '(or the pod) must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')


def capabilities_restricted(meta: dict, spec: dict) -> str | None:
    if _windows(spec):
        return None
    caps = [(c, _sc(c).get("capabilities") or {}) for c in _containers(spec)]
    no_drop = [c for c, cap in caps if "ALL" not in (cap.get("drop") or [])]
    adds = [c for c, cap in caps if set(cap.get("add") or []) - {"NET_BIND_SERVICE"}]
    reasons = [r for r in (_bad(no_drop, 'must set securityContext.capabilities.drop=["ALL"]'),
                           _bad(adds, "must add no capability but NET_BIND_SERVICE")) if r]
    return "; ".join(reasons) or None


BASELINE: dict[str, Control] = {
    "windowsHostProcess": windows_host_process, "hostNamespaces": host_namespaces, "privileged": privileged,
    "capabilities_baseline": capabilities_baseline, "hostPathVolumes": host_path_volumes, "hostPorts": host_ports,
    "hostProbesAndHostLifecycle": host_probes_and_lifecycle, "appArmorProfile": app_armor_profile,
    "seLinuxOptions": selinux_options, "procMount": proc_mount_baseline, "seccompProfile_baseline": seccomp_baseline,
    "sysctls": sysctls}
# Restricted adds its controls; one that tightens a baseline control replaces it (the upstream's overrides).
OVERRIDES = {"hostPathVolumes": "restrictedVolumes", "capabilities_baseline": "capabilities_restricted",
             "seccompProfile_baseline": "seccompProfile_restricted", "procMount": "procMount_restricted"}
RESTRICTED: dict[str, Control] = {
    **{k: v for k, v in BASELINE.items() if k not in OVERRIDES},
    "restrictedVolumes": restricted_volumes, "allowPrivilegeEscalation": allow_privilege_escalation,
    "runAsNonRoot": run_as_non_root, "runAsUser": run_as_user, "seccompProfile_restricted": seccomp_restricted,
    "capabilities_restricted": capabilities_restricted, "procMount_restricted": _proc_mount}
CONTROLS: dict[str, dict[str, Control]] = {"privileged": {}, "baseline": BASELINE, "restricted": RESTRICTED}


def check_pod(meta: dict, spec: dict, level: str) -> tuple[Violation, ...]:
    """The controls of `level` this pod breaks (empty: the API server admits it at that level)."""
    if level not in CONTROLS:
        raise ValueError(f"unknown Pod Security level {level!r}: one of {', '.join(LEVELS)}")
    return tuple(Violation(cid, r) for cid, control in CONTROLS[level].items() if (r := control(meta or {}, spec or {})))


def pod_template(doc: dict) -> Pod | None:
    """(metadata, spec) of the pod an object makes, or None for an object that makes no pod."""
    path = _POD_TEMPLATE_PATHS.get(doc.get("kind", ""))
    if path is None:
        return None
    node = doc
    for key in path:
        node = node.get(key) or {}
    return node.get("metadata") or {}, node.get("spec") or {}


def namespace_levels(docs: Iterable[dict]) -> dict[str, dict[str, str]]:
    """Namespace -> mode -> level, for each Namespace in the manifests (a mode without its label: privileged)."""
    out = {}
    for doc in docs:
        if doc.get("kind") == "Namespace":
            labels = (doc.get("metadata") or {}).get("labels") or {}
            out[doc["metadata"]["name"]] = {m: labels.get(LABEL_PREFIX + m, "privileged") for m in MODES}
    return out


def check_manifests(docs: Iterable[dict], assume: str = "restricted") -> list[Finding]:
    """Every pod template against each mode of its namespace; a namespace the manifests do not hold is
    taken to set `assume` for every mode."""
    docs = [d for d in docs if isinstance(d, dict)]
    levels = namespace_levels(docs)
    findings = []
    for doc in docs:
        pod = pod_template(doc)
        if pod is None:
            continue
        ns = (doc.get("metadata") or {}).get("namespace") or "default"
        workload = f"{doc['kind']} {ns}/{(doc.get('metadata') or {}).get('name', '')}"
        for mode, level in levels.get(ns, dict.fromkeys(MODES, assume)).items():
            violations = check_pod(*pod, level)
            if violations:
                findings.append(Finding(workload, ns, mode, level, violations))
    return findings


__all__ = ["LEVELS", "POLICY_RELEASE", "Finding", "Violation", "check_manifests", "check_pod",
           "namespace_levels", "pod_template"]
