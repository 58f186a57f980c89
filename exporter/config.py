"""The exporter's settings as typed dataclasses, loaded from YAML and merged with CLI flags.

Every validation error names the file, the field and the fix, because the person reading it is
an operator with a DaemonSet in CrashLoopBackOff, not the author of this module.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from exporter.adapters import ADAPTERS
from llmslo import fields
from llmslo.durations import parse_go_duration
from llmslo.fields import Fields, Problem
from llmslo.problems import describe

# Engine kinds with an adapter (contract 2), plus `auto` (detect from the page).
ENGINE_KINDS = tuple(ADAPTERS)  # one per adapter, each named in llmslo.conventions (ENGINE_KINDS)
AUTO_KIND = "auto"
TARGET_KINDS = ENGINE_KINDS + (AUTO_KIND,)
URL_SCHEMES = ("http", "https", "file")
GPU_SPEC_HELP = "nvml, fake:N or off"

DEFAULT_PORT = 9410  # next to dcgm-exporter's 9400, which often runs on the same node
DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 3.0
DEFAULT_MAX_PAGE_BYTES = 16 * 1024 * 1024
DEFAULT_GPU_TIMEOUT_S = 5.0
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's, as dcgm-exporter reads it
DEFAULT_POD_RESOURCES_TIMEOUT_S = 1.0


class ConfigError(ValueError):
    """Settings are wrong; the message has one line per problem (llmslo.problems: file:line, field, fix), every
    problem of the file at once, so an operator fixes them all in one edit instead of one per restart."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


@dataclass(frozen=True)
class Listen:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TargetConfig:
    """One engine (or tap) /metrics page to scrape; model/pod/namespace become identity labels."""

    kind: str
    url: str
    name: str = ""  # the `target` label of self-metrics; defaults to the URL without credentials
    model: str = ""  # fallback when the page does not name the model
    pod: str = ""
    namespace: str = ""
    timeout_s: float | None = None  # None: the config-wide default
    max_page_bytes: int | None = None

    @cached_property
    def label(self) -> str:
        """The name, else the URL without credentials (read several times a cycle: split once)."""
        return self.name or redact_url(self.url)


@dataclass(frozen=True)
class Limits:
    """Cardinality caps per target; what exceeds them is dropped and counted."""

    max_series_per_target: int = 20000
    max_lora_adapters_per_target: int = 64
    # Samples of one family read from a page (the largest engine family seen is about 1,000 lines):
    # the rest are counted, never parsed, so a flood of one family costs little.
    max_samples_per_family: int = 10000


@dataclass(frozen=True)
class KubernetesDiscovery:
    """Find engine pods on this node through the API server (in-cluster service account)."""

    enabled: bool = False
    label_selector: str = "llmslo.io/engine"
    engine_label: str = "llmslo.io/engine"
    port_annotation: str = "llmslo.io/metrics-port"
    path_annotation: str = "llmslo.io/metrics-path"
    scheme_annotation: str = "llmslo.io/metrics-scheme"
    model_annotation: str = "llmslo.io/model"
    tap_port_annotation: str = "llmslo.io/tap-port"
    # Empty: every namespace (one ClusterRole). Discovered targets are pinned to the pod's own IP and
    # declared ports, so a pod elsewhere can only show its own page under its own namespace label;
    # multi-tenant clusters list their engine namespaces (a Role in each), as deploy/overlays/production does.
    namespaces: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] = ()  # ports accepted though no container of the pod declares them
    allow_host_network: bool = False  # a hostNetwork pod's IP is the node's: opt in to scrape such pods
    refresh_interval_s: float = 30.0
    # Bounds of one listing (all pages, all namespaces); past one, the listing is abandoned and the
    # last good target list stays. A node runs at most a few hundred pods (kubelet's max-pods is 110
    # by default) and the API server fills each page up to PAGE_LIMIT (100), so a listing is one to
    # three pages; the bounds leave room for a proxy that ignores the node's field selector.
    max_pages: int = 100
    max_items: int = 10_000
    listing_timeout_s: float = 30.0  # the default refresh interval: a longer listing only falls behind
    api_server: str = ""  # empty: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    service_account_dir: str = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class ExporterConfig:
    listen: Listen = field(default_factory=Listen)
    interval_s: float = DEFAULT_INTERVAL_S
    gpu: str = "nvml"
    gpu_timeout_s: float = DEFAULT_GPU_TIMEOUT_S
    targets: tuple[TargetConfig, ...] = ()
    timeout_s: float | None = None  # None: DEFAULT_TIMEOUT_S, but never longer than the interval
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
    limits: Limits = field(default_factory=Limits)
    web_config_file: str = ""
    node_name: str = ""
    # The node pool this node belongs to (llm_exporter_node_pool_info; the inference pool's isolation alerts read
    # it): the install sets it per pool, as the value of the node label its DaemonSet selects on. "": not told.
    node_pool: str = ""
    discovery: KubernetesDiscovery = field(default_factory=KubernetesDiscovery)
    log_level: str = "info"
    # The kubelet's pod-resources socket GPUs are mapped to pods with; "off" turns the mapping off.
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    pod_resources_timeout_s: float = DEFAULT_POD_RESOURCES_TIMEOUT_S
    # The node's podmap relay (exporter/gpu/podmap.py), read instead of the socket when set: what the shipped
    # DaemonSet uses, since the exporter itself may not mount the kubelet's folder.
    pod_resources_url: str = ""

    def target_timeout(self, target: TargetConfig) -> float:
        """The target's deadline; at most one interval, so a slow target never delays the next cycle."""
        configured = target.timeout_s if target.timeout_s is not None else self.timeout_s
        if configured is None:
            return min(DEFAULT_TIMEOUT_S, self.interval_s)
        return min(configured, self.interval_s)

    def timeouts_clamped(self) -> list[TargetConfig]:
        """Targets whose configured timeout is longer than the interval (and so is cut to it)."""
        return [t for t in self.targets
                if (t.timeout_s if t.timeout_s is not None else self.timeout_s or 0) > self.interval_s]

    def target_max_bytes(self, target: TargetConfig) -> int:
        return target.max_page_bytes if target.max_page_bytes is not None else self.max_page_bytes


# --------------------------------------------------------------------------------------
# Small value parsers (each raises ValueError with a human message; callers add the location)
# --------------------------------------------------------------------------------------
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}


def parse_seconds_or_go_duration(value: Any) -> float:
    """Seconds from a number of seconds (`5`, `"2.5"`) or a Go duration (`500ms`, `5s`, `1m30s`); more than zero."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text) if _NUMBER.match(text) else parse_go_duration(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a duration") from None
    if seconds <= 0:
        raise ValueError(f"{value!r} must be more than zero")
    return seconds


class UnitError(ValueError):
    """A bare number outside the plausible range of what it measures; `fix` says what to write."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


def parse_interval(value: Any) -> float:
    """The collection interval: a Go duration (`500ms`, `5s`) is taken as written; a bare number of seconds must
    lie in llmslo.ranges' range, so `500` meant as milliseconds is refused with "500 looks like milliseconds:
    write 0.5" (write `500s` to mean 500 seconds)."""
    from llmslo.ranges import check as range_check  # here: a run without an interval never loads the table

    seconds = parse_seconds_or_go_duration(value)
    bare = isinstance(value, (int, float)) or bool(_NUMBER.match(str(value).strip()))
    wrong = range_check("exporter_interval", seconds) if bare else None
    if wrong is not None:
        keep = f"or write {value}s to mean {seconds:g} seconds"
        fix = (f"write {wrong.suggested:g} (or {seconds:g}ms), {keep}" if wrong.suggested is not None
               else f"write a duration such as 5s, {keep}")
        raise UnitError(wrong.message, fix)
    return seconds


def parse_size(value: Any) -> int:
    """Bytes from an integer or a string like `16MiB`, `200MB`."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise ValueError(f"{value!r} is not a size")
        size = int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()]
    if size <= 0:
        raise ValueError(f"{value!r} must be more than zero")
    return size


def parse_listen(value: str) -> Listen:
    """`HOST:PORT`, `:PORT` or `[v6]:PORT`."""
    text = str(value).strip()
    m = re.match(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:]*)):(?P<port>\d+)$", text)
    if not m:
        raise ValueError(f"{value!r} is not HOST:PORT")
    port = int(m.group("port"))
    if port > 65535:
        raise ValueError(f"port {port} is above 65535")
    host = m.group("v6") or m.group("host") or "0.0.0.0"
    return Listen(host, port)


def parse_gpu_spec(value: str | bool) -> str:
    if value is False:  # YAML 1.1 reads a bare `off` as false
        return "off"
    from exporter.gpu.spec import parse_spec  # the GPU package owns what a spec may say (e.g. the fake's GPU cap)

    text = str(value).strip()
    try:
        parse_spec(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a GPU provider") from None
    return text


def check_url(url: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme not in URL_SCHEMES:
        raise ValueError(f"{url!r} must start with http://, https:// or file://")
    if scheme != "file" and not urlsplit(url).hostname:
        raise ValueError(f"{url!r} has no host")
    return url


def check_kind(kind: str) -> str:
    if kind not in TARGET_KINDS:
        raise ValueError(f"unknown engine kind {kind!r} (one of {', '.join(TARGET_KINDS)})")
    return kind


def redact_url(url: str) -> str:
    """The URL without user:password@, so credentials never reach a label or a log line."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def parse_engine_flag(value: str) -> TargetConfig:
    """`--engine KIND=URL`."""
    kind, sep, url = value.partition("=")
    if not sep:
        raise ConfigError(f"--engine {value!r}: expected KIND=URL, e.g. --engine vllm=http://127.0.0.1:8000/metrics")
    try:
        return TargetConfig(kind=check_kind(kind.strip()), url=check_url(url.strip()))
    except ValueError as exc:
        raise ConfigError(f"--engine {value!r}: {exc}") from None


NODE_POOL_ENV = "LLMSLO_NODE_POOL"
# A Kubernetes label value (the pool is a node label's value): at most 63 characters, alphanumerics at both ends.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
NODE_POOL_FIX = "write the value of the node label that names the pool, e.g. inference (a Kubernetes label value)"


def parse_node_pool(value: Any) -> str:
    """A pool name: a Kubernetes label value (it becomes the node_pool label), or empty."""
    text = fields.text(value).strip()
    if not _LABEL_VALUE.match(text):
        raise ValueError(f"{text[:80]!r} is not a Kubernetes label value (at most 63 letters, digits, '-', '_' or '.', "
                         "beginning and ending with a letter or digit)")
    return text


def resolve_node_pool(configured: str) -> str:
    """Config/flag first, then $LLMSLO_NODE_POOL (the DaemonSet's env); ConfigError for a value that is no label
    value, naming where it came from."""
    if configured:
        return configured
    value = os.environ.get(NODE_POOL_ENV, "")
    try:
        return parse_node_pool(value)
    except ValueError as exc:
        raise ConfigError(describe(f"${NODE_POOL_ENV}", str(exc), fix=NODE_POOL_FIX)) from None


def resolve_node_name(configured: str) -> str:
    """Config/flag first, then NODE_NAME (downward API in the DaemonSet), then the hostname."""
    return configured or os.environ.get("NODE_NAME", "") or os.uname().nodename  # gethostname's, without socket


# --------------------------------------------------------------------------------------
# YAML loading
# --------------------------------------------------------------------------------------
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parse_namespaces(value: Any) -> tuple[str, ...]:
    """Namespace names (DNS-1123 labels), from a list or one comma-separated string; duplicates dropped."""
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(_str_list(value))
    out: list[str] = []
    for ns in items:
        if not _NAMESPACE.fullmatch(ns):
            raise ValueError(f"{ns[:70]!r} is not a namespace name (lower-case letters, digits and '-', at most 63)")
        if ns not in out:
            out.append(ns)
    if not out:
        raise ValueError("no namespace given")
    return tuple(out)


def _port_list(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535 for v in value):
        raise ValueError(f"expected a list of port numbers (1-65535), got {value!r}")
    return tuple(value)


def _str_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of strings, got {value!r}")
    return tuple(value)


_TOP_KEYS = (
    "listen", "interval", "gpu", "gpu_timeout", "node_name", "node_pool", "web_config_file", "log_level",
    "pod_resources_socket", "pod_resources_timeout", "pod_resources_url",
    "scrape", "limits", "targets", "kubernetes_discovery",
)
_TARGET_KEYS = ("kind", "url", "name", "model", "pod", "namespace", "timeout", "max_page_bytes")
_DISCOVERY_KEYS = (
    "enabled", "label_selector", "engine_label", "port_annotation", "path_annotation", "scheme_annotation",
    "model_annotation", "tap_port_annotation", "namespaces", "allowed_ports", "allow_host_network", "refresh_interval",
    "max_pages", "max_items", "listing_timeout", "api_server", "service_account_dir",
)


def _load_target(parent: Fields, index: int, data: Any, line: int | None) -> TargetConfig | None:
    """One `targets:` item; None (its problems recorded) when it cannot make a target."""
    r = Fields(parent.file, f"targets[{index}]", data, parent.problems, line)
    r.check_keys(_TARGET_KEYS)
    missing = [key for key in ("kind", "url") if key not in r.data]
    for key in missing:
        r.error(key, "missing", f"add `{key}:` to this target")
    target = TargetConfig(
        kind=r.get("kind", lambda v: check_kind(fields.text(v)), "", f"use one of {', '.join(TARGET_KINDS)}"),
        url=r.get("url", lambda v: check_url(fields.text(v)), "", "use http(s)://host:port/metrics or file:///path"),
        name=r.get("name", fields.text, "", "use a short string"),
        model=r.get("model", fields.text, "", "use the served model name"),
        pod=r.get("pod", fields.text, "", "use the pod name"),
        namespace=r.get("namespace", fields.text, "", "use the namespace name"),
        timeout_s=r.get("timeout", parse_seconds_or_go_duration, None, "use a duration such as 2s"),
        max_page_bytes=r.get("max_page_bytes", parse_size, None, "use a size such as 16MiB"),
    )
    return target if target.kind and target.url and not missing else None


def _load_discovery(r: Fields) -> KubernetesDiscovery:
    r.check_keys(_DISCOVERY_KEYS)
    d = KubernetesDiscovery()
    text = "use a string"
    return KubernetesDiscovery(
        enabled=r.get("enabled", fields.boolean, d.enabled, "write true or false"),
        label_selector=r.get("label_selector", fields.text, d.label_selector, "use a Kubernetes label selector"),
        engine_label=r.get("engine_label", fields.text, d.engine_label, text),
        port_annotation=r.get("port_annotation", fields.text, d.port_annotation, text),
        path_annotation=r.get("path_annotation", fields.text, d.path_annotation, text),
        scheme_annotation=r.get("scheme_annotation", fields.text, d.scheme_annotation, text),
        model_annotation=r.get("model_annotation", fields.text, d.model_annotation, text),
        tap_port_annotation=r.get("tap_port_annotation", fields.text, d.tap_port_annotation, text),
        namespaces=r.get("namespaces", lambda v: () if v == [] else parse_namespaces(v), d.namespaces,
                         "use a list of namespace names, or [] for all namespaces"),
        allowed_ports=r.get("allowed_ports", _port_list, d.allowed_ports, "use a list such as [8000]"),
        allow_host_network=r.get("allow_host_network", fields.boolean, d.allow_host_network, "write true or false"),
        refresh_interval_s=r.get("refresh_interval", parse_seconds_or_go_duration, d.refresh_interval_s, "use a duration such as 30s"),
        max_pages=r.get("max_pages", fields.positive_int, d.max_pages, "use a whole number such as 100"),
        max_items=r.get("max_items", fields.positive_int, d.max_items, "use a whole number such as 10000"),
        listing_timeout_s=r.get("listing_timeout", parse_seconds_or_go_duration, d.listing_timeout_s, "use a duration such as 30s"),
        api_server=r.get("api_server", lambda v: check_url(fields.text(v)), d.api_server, "use https://host:port"),
        service_account_dir=r.get("service_account_dir", fields.text, d.service_account_dir, "use a directory path"),
    )


def load_config(path: str | os.PathLike[str], *, check: bool = True) -> ExporterConfig:
    """Read and validate a YAML config file; raises ConfigError naming file, field and fix.

    `check=False` leaves the cross-field checks (`check_config`) to the caller, for settings that flags
    may still supply: the CLI runs them after merging its flags (`--node-name` answers discovery's need
    for the node's name).
    """
    path_s = str(path)
    try:
        with open(path, encoding="utf-8") as f:  # not pathlib: its import is start-up time
            text = f.read()
    except OSError as exc:
        raise ConfigError(describe(path_s, f"cannot read the config file ({exc.strerror})",
                                   fix="pass an existing, readable file to --config")) from None
    from llmslo.specfile import SpecFileError, load_documents  # only with --config: start-up time (PyYAML)

    try:
        documents = load_documents(text, path_s)
    except SpecFileError as exc:
        raise ConfigError(str(exc)) from None
    problems: list[Problem] = []  # reported in the file's order
    if len(documents) > 1:
        problems.append(Problem(path_s, f"{len(documents)} YAML documents; the exporter reads one",
                                fix="keep one document (remove the `---` separators)"))
    r = Fields(path_s, "", documents[0] if documents else None, problems)
    r.check_keys(_TOP_KEYS)
    scrape = r.child("scrape")
    scrape.check_keys(("timeout", "max_page_bytes"))
    limits = r.child("limits")
    limits.check_keys(("max_series_per_target", "max_lora_adapters_per_target", "max_samples_per_family"))
    targets_data = r.data.get("targets") or []
    if not isinstance(targets_data, list):
        r.error("targets", "expected a list", "write `targets:` followed by `- kind: ...` items")
        targets_data = []
    targets = [_load_target(r, i, t, getattr(targets_data, "line", None)) for i, t in enumerate(targets_data)]
    target_lines = tuple(getattr(data, "line", None) for data, t in zip(targets_data, targets, strict=True) if t is not None)
    d = ExporterConfig()
    config = ExporterConfig(
        listen=r.get("listen", parse_listen, d.listen, f"write HOST:PORT, e.g. 0.0.0.0:{DEFAULT_PORT}"),
        interval_s=r.get("interval", parse_interval, d.interval_s, "use a duration such as 5s"),
        gpu=r.get("gpu", parse_gpu_spec, d.gpu, f"write {GPU_SPEC_HELP}"),
        gpu_timeout_s=r.get("gpu_timeout", parse_seconds_or_go_duration, d.gpu_timeout_s, "use a duration such as 5s"),
        node_name=r.get("node_name", fields.text, d.node_name, "use the Kubernetes node name"),
        node_pool=r.get("node_pool", parse_node_pool, d.node_pool, NODE_POOL_FIX),
        web_config_file=r.get("web_config_file", fields.text, d.web_config_file, "use a file path"),
        log_level=r.get("log_level", _log_level, d.log_level, "write debug, info, warning or error"),
        pod_resources_socket=r.get("pod_resources_socket", _socket_path, d.pod_resources_socket,
                                   f"write a path such as {DEFAULT_POD_RESOURCES_SOCKET}, or off"),
        pod_resources_url=r.get("pod_resources_url", _http_url, d.pod_resources_url,
                                "write the relay's URL, e.g. http://llmslo-podmap.llmslo-node.svc:9412/v1/owners"),
        pod_resources_timeout_s=r.get("pod_resources_timeout", parse_seconds_or_go_duration, d.pod_resources_timeout_s,
                                      "use a duration such as 1s"),
        timeout_s=scrape.get("timeout", parse_seconds_or_go_duration, d.timeout_s, "use a duration such as 3s"),
        max_page_bytes=scrape.get("max_page_bytes", parse_size, d.max_page_bytes, "use a size such as 16MiB"),
        limits=Limits(
            max_series_per_target=limits.get("max_series_per_target", fields.positive_int, d.limits.max_series_per_target, "use a whole number such as 20000"),
            max_lora_adapters_per_target=limits.get("max_lora_adapters_per_target", fields.positive_int, d.limits.max_lora_adapters_per_target, "use a whole number such as 64"),
            max_samples_per_family=limits.get("max_samples_per_family", fields.positive_int, d.limits.max_samples_per_family, "use a whole number such as 10000"),
        ),
        targets=tuple(t for t in targets if t is not None),
        discovery=_load_discovery(r.child("kubernetes_discovery")),
    )
    messages = [str(p) for p in sorted(problems, key=lambda p: p.line or 0)]
    if check:
        messages += cross_field_problems(config, path_s, target_lines)
    if messages:
        raise ConfigError("\n".join(messages), tuple(messages))
    return config


def _socket_path(value: Any) -> str:
    text = fields.text(value).strip()
    if not text:
        raise ValueError("empty path")
    if text != "off" and not text.startswith("/"):
        raise ValueError(f"{text!r} is not an absolute path")
    return text


def _http_url(value: Any) -> str:
    text = fields.text(value).strip()
    if text and not re.match(r"^http://[^/\s?#]+(/[^\s?#]*)?$", text):
        raise ValueError(f"{text!r} is not an http:// URL (the relay answers plain HTTP on the pod network)")
    return text


def _log_level(value: Any) -> str:
    text = fields.text(value).lower()
    if text not in ("debug", "info", "warning", "error"):
        raise ValueError(f"unknown log level {value!r}")
    return text


def cross_field_problems(config: ExporterConfig, source: str, target_lines: tuple[int | None, ...] = ()) -> list[str]:
    """Checks across fields, for a loaded file and for the config after CLI flags are merged. `target_lines`: the
    file's line of each target, when it comes from one."""
    problems = []
    labels = [t.label for t in config.targets]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            line = target_lines[i] if i < len(target_lines) else None
            problems.append(describe(source, f"two targets are both named {label!r}", line=line, field=f"targets[{i}]",
                                     fix="give each target a distinct `name:` (or remove the duplicate)"))
    if config.discovery.enabled and not (config.node_name or os.environ.get("NODE_NAME")):
        problems.append(describe(
            source, "discovery needs this node's name", field="kubernetes_discovery.enabled",
            fix="set NODE_NAME from the downward API (fieldRef spec.nodeName), node_name in the file, or --node-name"))
    return problems


def check_config(config: ExporterConfig, source: str) -> None:
    problems = cross_field_problems(config, source)
    if problems:
        raise ConfigError("\n".join(problems), tuple(problems))


def merge_cli(
    config: ExporterConfig,
    *,
    listen: str | None = None,
    engines: list[str] | tuple[str, ...] = (),
    gpu: str | None = None,
    interval: str | None = None,
    web_config: str | None = None,
    node_name: str | None = None,
    node_pool: str | None = None,
    log_level: str | None = None,
    pod_resources_socket: str | None = None,
    pod_resources_url: str | None = None,
    discovery_namespaces: list[str] | tuple[str, ...] = (),
    source: str = "command line",
) -> ExporterConfig:
    """Flags override file settings; `--engine` targets are added to the file's targets.

    The cross-field checks run on the merged result; `source` names it in their messages.
    """
    changes: dict[str, Any] = {}

    def flag(name: str, parse, value, fix: str):
        try:
            return parse(value)
        except ValueError as exc:
            raise ConfigError(describe(f"--{name} {value!r}", str(exc), fix=getattr(exc, "fix", fix))) from None

    if listen is not None:
        changes["listen"] = flag("web.listen-address", parse_listen, listen, f"write HOST:PORT, e.g. 0.0.0.0:{DEFAULT_PORT}")
    if gpu is not None:
        changes["gpu"] = flag("gpu", parse_gpu_spec, gpu, f"write {GPU_SPEC_HELP}")
    if interval is not None:
        changes["interval_s"] = flag("interval", parse_interval, interval, "give seconds, e.g. 5")
    if web_config is not None:
        changes["web_config_file"] = web_config
    if node_name is not None:
        changes["node_name"] = node_name
    if node_pool is not None:
        changes["node_pool"] = flag("node-pool", parse_node_pool, node_pool, NODE_POOL_FIX)
    if log_level is not None:
        changes["log_level"] = flag("log.level", _log_level, log_level, "write debug, info, warning or error")
    if pod_resources_socket is not None:
        changes["pod_resources_socket"] = flag("pod-resources-socket", _socket_path, pod_resources_socket,
                                               f"write a path such as {DEFAULT_POD_RESOURCES_SOCKET}, or off")
    if pod_resources_url is not None:
        changes["pod_resources_url"] = flag("pod-resources-url", _http_url, pod_resources_url,
                                            "write http://HOST:PORT/v1/owners")
    if discovery_namespaces:
        namespaces = flag("discovery-namespaces", parse_namespaces, ",".join(discovery_namespaces),
                          "give namespace names, e.g. --discovery-namespaces llm,batch")
        changes["discovery"] = replace(config.discovery, namespaces=namespaces)
    if engines:
        changes["targets"] = config.targets + tuple(parse_engine_flag(e) for e in engines)
    merged = replace(config, **changes)
    check_config(merged, source)
    return merged
