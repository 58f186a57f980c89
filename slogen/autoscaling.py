"""The autoscaling spec: which inference pool scales on which serving signals (docs/autoscaling.md).

A companion file next to the SLO specs, owned by whoever owns capacity, not by the SLO authors:

    version: "llmslo/autoscaling/v1"
    pools:
      - name: vllm-llama-3-8b
        namespace: llm
        target: {kind: Deployment, name: vllm-llama-3-8b}
        replicas: {min: 1, max: 8}
        match: {namespace: llm, model: llama-3-8b}
        triggers:
          queue_depth: {per_replica: 4}
          kv_cache_utilization: {per_replica: 0.85}
          kv_seats: {min_free: 8}   # optional: keep 8 seats of p99 request size free
          ttft_burn_rate: {slo: chat/ttft, above: 2, window: 5m}
        # only with replicas.min: 0: what wakes the pool, a request metric of the gateway in front of it
        wake: {metric: nginx_ingress_controller_requests, selector: {ingress: vllm-llama-3-8b}}

Errors are slogen's SpecErrors (file:line, field, fix), all of them in one run: a pool with three mistakes
reports three errors, and `slogen validate` reports what `slogen build` would refuse (slogen/catalog.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmslo import conventions as c
from llmslo import fields
from llmslo.specfile import SpecFileError, load_documents
from slogen.errors import SpecError, SpecErrors, SpecFields

VERSION = "llmslo/autoscaling/v1"
DEFAULT_DIR = "autoscaling"
DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"

# Labels a pool may be matched on: the identity of engine series, and `cluster` for fleets.
MATCH_LABELS = (c.LABEL_CLUSTER, c.LABEL_NAMESPACE, c.LABEL_MODEL, c.LABEL_ENGINE, c.LABEL_POD, c.LABEL_NODE)
# Burn-rate windows a scaler may read: short ones only. A 1h+ window keeps "burning" long after
# capacity was added, so the pool would keep growing and then refuse to shrink.
SHORT_WINDOWS = ("1m", "2m", "5m", "10m")
TARGET_KINDS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1"}

# Every mapping's keys (allowed, required), by where it sits; the loader checks them and slogen/schema.py
# writes them into the JSON Schema, so the two cannot drift.
KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "policy": (("stabilization", "max_pods", "max_percent", "period"), ()),
    "wake": (("query", "metric", "selector", "window", "per_replica"), ()),
    "pool": (("name", "namespace", "target", "replicas", "match", "triggers", "wake", "prometheus",
              "authentication_ref", "polling_interval", "cooldown_period", "scale_up", "scale_down"),
             ("name", "namespace", "target", "replicas", "match", "triggers")),
    "target": (("kind", "name"), ("name",)),
    "replicas": (("min", "max"), ("max",)),
    "triggers": (("queue_depth", "kv_cache_utilization", "kv_seats", "ttft_burn_rate"), ()),
    "queue_depth": (("per_replica",), ("per_replica",)),
    "kv_cache_utilization": (("per_replica",), ("per_replica",)),
    "kv_seats": (("min_free",), ("min_free",)),
    "ttft_burn_rate": (("slo", "above", "window"), ("slo", "above")),
    "spec": (("version", "pools"), ("version", "pools")),
}

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class AutoscalingError(SpecErrors):
    """Every problem found in the autoscaling specs, each a SpecError naming the file, line, field and fix."""


class _PoolRefused(Exception):
    """A pool cannot be read further (its problem is already recorded); the next pool is read."""


@dataclass(frozen=True)
class QueueDepthTrigger:
    per_replica: float  # waiting requests one replica may carry before another is added


@dataclass(frozen=True)
class KVUtilizationTrigger:
    per_replica: float  # mean KV-cache usage (0..1] to hold each replica at


@dataclass(frozen=True)
class KVSeatsTrigger:
    min_free: float  # p99-size seats the pool should keep free (llm:kv_seats:p99, alerts/llmslo-capacity)


@dataclass(frozen=True)
class TTFTBurnTrigger:
    slo: str  # "service/slo-name"
    above: float  # burn rate over which capacity is added proportionally
    window: str = "5m"
    file: str = ""  # where `slo:` is written, for the errors about the SLO it names
    field: str = ""
    line: int | None = None
    window_line: int | None = None

    @property
    def window_field(self) -> str:
        return self.field.rsplit(".", 1)[0] + ".window"

    def error(self, problem: str, fix: str, key: str = "slo") -> SpecError:
        field = self.field if key == "slo" else self.window_field
        return SpecError(self.file, problem, field, "", fix, self.line if key == "slo" else self.window_line)


@dataclass(frozen=True)
class WakeSignal:
    """What wakes a pool at zero replicas: a request metric that exists without them (the gateway's or
    ingress's in front of the pool). Either a counter (`metric` + `selector`, read as a rate over `window`)
    or a whole PromQL `query` answering requests per second."""

    query: str = ""
    metric: str = ""
    selector: tuple[tuple[str, str], ...] = ()
    window: str = "1m"
    per_replica: float = 0.0  # requests/s one replica carries; 0: it only wakes the pool, other triggers size it


# Metrics the pool's own pods write (the exporter's and the tap's, the rules recorded from them, the engines'
# own): they vanish with the last replica, so none can wake the pool.
_POOL_METRIC = re.compile(r"(?<![\w:])(?:" + re.escape(c.PREFIX) + r"|llm:|vllm:|sglang:)[\w:]*")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
WAKE_FIX = ("name a request metric of the gateway or ingress in front of the pool, which exists at zero replicas: "
            "`wake: {metric: <its request counter>, selector: {<label>: <value>}}` or `wake: {query: <PromQL giving "
            "requests per second>}` (docs/autoscaling.md, \"Scale to zero\")")


@dataclass(frozen=True)
class ScalePolicy:
    stabilization_s: int
    max_pods: int
    max_percent: int  # 0: no percent policy (for scale-down it would round to zero pods on small pools)
    period_s: int


@dataclass(frozen=True)
class Pool:
    name: str
    namespace: str
    target_kind: str
    target_name: str
    min_replicas: int
    max_replicas: int
    match: dict[str, str]
    queue_depth: QueueDepthTrigger | None = None
    kv_cache_utilization: KVUtilizationTrigger | None = None
    ttft_burn_rate: TTFTBurnTrigger | None = None
    kv_seats: KVSeatsTrigger | None = None
    wake: WakeSignal | None = None
    prometheus: str = DEFAULT_PROMETHEUS
    authentication_ref: str = ""  # a KEDA TriggerAuthentication for a secured Prometheus
    polling_interval_s: int = 15
    cooldown_period_s: int = 300
    scale_up: ScalePolicy = ScalePolicy(stabilization_s=60, max_pods=2, max_percent=50, period_s=60)
    scale_down: ScalePolicy = ScalePolicy(stabilization_s=600, max_pods=1, max_percent=0, period_s=300)
    origin: str = ""  # "file:line: pools[i]"
    file: str = ""  # where the pool is, for SpecErrors
    field: str = ""
    line: int | None = None

    @property
    def target_api_version(self) -> str:
        return TARGET_KINDS[self.target_kind]


@dataclass(frozen=True)
class AutoscalingSpec:
    pools: tuple[Pool, ...] = field(default_factory=tuple)
    # every pool read to its end, those with problems too, in file order: what each says about the SLOs (its
    # burn trigger's `slo:`) is checked beside its other problems, all in one run (slogen.pools)
    read: tuple[Pool, ...] = field(default_factory=tuple)


class _Node(SpecFields):
    """One mapping of the spec with its location (llmslo.fields: file, line, field path). Problems go to
    `errors` (shared by every node of a load) so one run reports them all; a getter that finds one records it
    and returns a placeholder, and `error()` records and returns an exception to raise where reading cannot go
    on."""

    def __init__(self, file: str, where: str, data: Any, line: int | None = None,
                 errors: list[SpecError] | None = None):
        super().__init__(file, where, data if isinstance(data, dict) else {}, errors, line)
        self.errors: list[SpecError] = self.problems
        if not isinstance(data, dict):
            raise self.error("", f"expected a mapping, got {type(data).__name__}", "write key: value pairs here")

    def origin(self, key: str = "") -> str:
        """file:line: field, where this node (or its key) is."""
        line = self.line_of(key)
        return f"{self.file}{f':{line}' if line else ''}: {self.field(key) or '(top level)'}"

    def error(self, key: str, message: str, fix: str = "") -> _PoolRefused:  # type: ignore[override]
        """Record a problem; the returned exception, raised, stops reading this pool."""
        self.note(key, message, fix)
        return _PoolRefused()

    def note(self, key: str, message: str, fix: str) -> None:
        """Record a problem and read on."""
        self.errors.append(self.problem(key, message, fix))

    def keys(self, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
        self.check_keys(allowed, "unknown key")
        for key in required:
            if key not in self.data:
                self.note(key, "missing", f"add `{key}:`")

    def child(self, key: str) -> _Node:
        """The mapping at `key` ({} when missing: keys() reports a missing required key)."""
        data = self.data.get(key) if key in self.data else {}
        return _Node(self.file, self.field(key), data, self.line_of(key), self.errors)

    def string(self, key: str, default: str | None = None, pattern: re.Pattern[str] | None = None,
               fix: str = "use a string") -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or not value:
            if key in self.data or default is not None:  # a missing required key is reported by keys()
                self.note(key, f"expected a non-empty string, got {value!r}", fix)
            return default or "x"
        if pattern and not pattern.match(value):
            self.note(key, f"{value!r} is not valid", fix)
        return value

    def number(self, key: str, lo: float, hi: float | None = None, default: float | None = None,
               integer: bool = False) -> float:
        """A number in [lo, hi]; a missing required key (reported by keys()) reads as `lo`."""
        return self.get(key, fields.number(lo, hi, integer=integer), default if default is not None else lo)

    def seconds(self, key: str, default: int, hi: int) -> int:
        if self.data.get(key) is None:
            return default
        return self.get(key, fields.seconds(hi), default)


def _policy(node: _Node, default: ScalePolicy) -> ScalePolicy:
    node.keys(*KEYS["policy"])
    return ScalePolicy(
        stabilization_s=node.seconds("stabilization", default.stabilization_s, 3600),
        max_pods=int(node.number("max_pods", 1, default=default.max_pods, integer=True)),
        max_percent=int(node.number("max_percent", 0, 1000, default=default.max_percent, integer=True)),
        period_s=node.seconds("period", default.period_s, 1800) or default.period_s,
    )


def _wake(node: _Node) -> WakeSignal:
    node.keys(*KEYS["wake"])
    if ("query" in node.data) == ("metric" in node.data):
        raise node.error("", "needs exactly one of query and metric", WAKE_FIX)
    per_replica = node.number("per_replica", 0.001) if "per_replica" in node.data else 0.0
    if "query" in node.data:
        if "selector" in node.data or "window" in node.data:
            key = "selector" if "selector" in node.data else "window"
            raise node.error(key, "goes with metric, not query", "put the selector and window inside the query")
        query = node.string("query", fix="write PromQL that answers the requests per second in front of the pool")
        if len(query) > 2000:
            raise node.error("query", "longer than 2000 characters", "shorten the query or use metric and selector")
        own = _POOL_METRIC.search(re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', query))  # names, not label values
        if own:
            raise node.error("query", f"reads {own.group(0)!r}, which the pool's own pods write: it does not exist at "
                                      "zero replicas, so it cannot wake the pool", WAKE_FIX)
        return WakeSignal(query=query, per_replica=per_replica)
    metric = node.string("metric", pattern=_METRIC_NAME, fix="write a Prometheus metric name")
    if _POOL_METRIC.search(metric):
        raise node.error("metric", f"{metric!r} is written by the pool's own pods: it does not exist at zero replicas, "
                                   "so it cannot wake the pool", WAKE_FIX)
    if "selector" not in node.data:
        raise node.error("selector", "missing: without it every request the gateway sees, for any pool, would wake "
                                     "this one", "add `selector: {<label>: <value>}` naming this pool's route")
    sel = node.child("selector")
    if not sel.data:
        raise sel.error("", "empty", "name at least one label of this pool's route, e.g. {service: vllm-llama-3-8b}")
    for key in sel.data:
        if not isinstance(key, str) or not _LABEL_NAME.match(key):
            raise sel.error(str(key), "not a Prometheus label name", "use letters, digits and '_'")
    window = node.string("window", "1m")
    if window not in SHORT_WINDOWS:
        raise node.error("window", f"{window} is not a short window: the pool would wake late and sleep late",
                         f"use one of {', '.join(SHORT_WINDOWS)}")
    return WakeSignal(metric=metric, selector=tuple(sorted((k, sel.string(k)) for k in sel.data)), window=window,
                      per_replica=per_replica)


def _match(node: _Node) -> tuple[_Node, dict[str, str]]:
    """The pool's `match` labels. A namespace there must be the pool's own: KEDA scales the target in the pool's
    namespace, so engines matched in another would size it on someone else's load."""
    match = node.child("match")
    if not match.data and "match" in node.data:
        match.note("", "empty", "name at least the pool's namespace and model, e.g. {namespace: llm, model: m}")
    match.keys(MATCH_LABELS)
    labels = {k: match.string(k) for k in match.data}
    own, theirs = node.data.get("namespace"), labels.get(c.LABEL_NAMESPACE)
    if isinstance(own, str) and own and theirs is not None and theirs != own:
        match.note(c.LABEL_NAMESPACE, f"{theirs!r} is not the pool's namespace {own!r}: the pool would scale its "
                                      f"target in {own} on the load of the engines in {theirs}",
                   f"write namespace: {own} here (the namespace the target's engine pods run in), or move the pool "
                   f"to namespace: {theirs}")
    return match, labels


def _wake_of(node: _Node, replicas: _Node, lo: int) -> WakeSignal | None:
    """The pool's wake signal; a pool at min 0 needs one. A wake mapping that cannot be read is recorded and the
    rest of the pool read on (its burn trigger's SLO is still checked: slogen.pools)."""
    if "wake" in node.data:
        try:
            return _wake(node.child("wake"))
        except _PoolRefused:
            return None
    if lo == 0:
        replicas.note(
            "min", "0 replicas, but every trigger reads series the pool's own engine pods write (queue depth, KV "
                   "cache, seats, the tap's TTFT), and at zero replicas there are none: the pool could never wake",
            f"set min: 1, or {WAKE_FIX}")
    return None


def _policy_at(node: _Node, key: str, default: ScalePolicy) -> ScalePolicy:
    """The scale_up or scale_down policy (`default` when absent, or when it is not a mapping: recorded)."""
    if key not in node.data:
        return default
    try:
        return _policy(node.child(key), default)
    except _PoolRefused:
        return default


def _pool(node: _Node) -> Pool:
    node.keys(*KEYS["pool"])
    dns = "use lowercase letters, digits and '-' (a Kubernetes name)"
    name = node.string("name", pattern=_NAME, fix=dns)
    target = node.child("target")
    target.keys(*KEYS["target"])
    kind = target.string("kind", "Deployment")
    if kind not in TARGET_KINDS:
        target.note("kind", f"cannot scale a {kind}", f"use one of {', '.join(TARGET_KINDS)}")
        kind = "Deployment"
    replicas = node.child("replicas")
    replicas.keys(*KEYS["replicas"])
    lo = int(replicas.number("min", 0, default=1, integer=True))
    hi = int(replicas.number("max", max(lo, 1), integer=True))
    match, labels = _match(node)
    triggers = node.child("triggers")
    triggers.keys(*KEYS["triggers"])
    if not triggers.data and "triggers" in node.data:
        triggers.note("", "no trigger", "add queue_depth, kv_cache_utilization, kv_seats and/or ttft_burn_rate")
    queue = kv = burn = seats = None
    if "queue_depth" in triggers.data:
        t = triggers.child("queue_depth")
        t.keys(*KEYS["queue_depth"])
        queue = QueueDepthTrigger(t.number("per_replica", 0.1))
    if "kv_cache_utilization" in triggers.data:
        t = triggers.child("kv_cache_utilization")
        t.keys(*KEYS["kv_cache_utilization"])
        kv = KVUtilizationTrigger(t.number("per_replica", 0.05, 1.0))
    if "kv_seats" in triggers.data:
        t = triggers.child("kv_seats")
        t.keys(*KEYS["kv_seats"])
        if c.LABEL_NODE in labels:
            match.note(c.LABEL_NODE, "the recorded seats have no node label, so a kv_seats trigger would "
                              "read nothing", "match the pool on namespace and model (and cluster), not node")
        seats = KVSeatsTrigger(t.number("min_free", 1))
    if "ttft_burn_rate" in triggers.data:
        t = triggers.child("ttft_burn_rate")
        t.keys(*KEYS["ttft_burn_rate"])
        slo = t.string("slo", pattern=re.compile(r"^[^/]+/[^/]+$"), fix="write service/slo-name, e.g. chat/ttft")
        window = t.string("window", "5m")
        if window not in SHORT_WINDOWS:
            t.note("window", f"{window} is not a short window: scaling on it would lag capacity and never "
                             "scale back down in time", f"use one of {', '.join(SHORT_WINDOWS)}")
        burn = TTFTBurnTrigger(slo, t.number("above", 0.1), window, file=t.file, field=t.field("slo"),
                               line=t.line_of("slo"), window_line=t.line_of("window"))
    wake = _wake_of(node, replicas, lo)
    up, down = _policy_at(node, "scale_up", Pool.scale_up), _policy_at(node, "scale_down", Pool.scale_down)
    return Pool(
        name=name, namespace=node.string("namespace", pattern=_NAME, fix=dns), target_kind=kind,
        target_name=target.string("name", pattern=_NAME, fix=dns), min_replicas=lo, max_replicas=hi, match=labels,
        queue_depth=queue, kv_cache_utilization=kv, ttft_burn_rate=burn, kv_seats=seats, wake=wake,
        prometheus=node.string("prometheus", DEFAULT_PROMETHEUS),
        authentication_ref=node.string("authentication_ref", pattern=_NAME, fix=dns)
        if "authentication_ref" in node.data else "",
        polling_interval_s=node.seconds("polling_interval", 15, 3600) or 15,
        cooldown_period_s=node.seconds("cooldown_period", 300, 86400),
        scale_up=up, scale_down=down, origin=node.origin(), file=node.file, field=node.field(),
        line=node.line_of("name"),
    )


def load_text(text: str | bytes, file: str) -> AutoscalingSpec:
    """The pools of one file; AutoscalingError lists every problem in it."""
    errors: list[SpecError] = []
    pools = tuple(pool for pool, clean in _read(text, file, errors) if clean)
    if errors:
        raise AutoscalingError(errors)
    return AutoscalingSpec(pools, pools)


def _read(text: str | bytes, file: str, errors: list[SpecError]) -> list[tuple[Pool, bool]]:
    """The pools of one file read to their end, each with whether it read without a problem; every problem
    appended to `errors`."""
    pools: list[tuple[Pool, bool]] = []
    try:
        docs = load_documents(text, file)
    except SpecFileError as exc:  # not UTF-8, not YAML, a duplicate key, nesting too deep
        errors.append(SpecError(exc.file, exc.message, "", "", exc.fix, exc.line))
        return []
    for i, doc in enumerate(docs):
        before = len(errors)
        try:
            top = _Node(file, f"document {i}" if len(docs) > 1 else "", doc, errors=errors)
        except _PoolRefused:
            continue
        top.keys(*KEYS["spec"])
        version = top.data.get("version")
        if "version" in top.data and version != VERSION:
            top.note("version", f"unknown version {version!r}", _version_fix(version))
        pools_node = top.data.get("pools")
        if "pools" in top.data and not isinstance(pools_node, list):
            top.note("pools", "expected a list", "write `pools:` followed by `- name: ...` items")
        if len(errors) > before or not isinstance(pools_node, list):
            continue  # a document of another kind, or no pools list: its pools would only add noise
        for j, item in enumerate(pools_node):
            where = f"{top.where + '.' if top.where else ''}pools[{j}]"
            first = len(errors)
            try:
                pool = _pool(_Node(file, where, item, getattr(pools_node, "line", None), errors))
            except _PoolRefused:
                continue
            pools.append((pool, len(errors) == first))
    return pools


def _version_fix(version: object) -> str:
    if isinstance(version, str) and (version == "prometheus/v1" or version.startswith(("openslo/", "sloth.slok.dev/"))):
        return (f"this is an SLO spec (version {version}), not an autoscaling spec: move it to the SLO inputs "
                f"(slos/), or write version: \"{VERSION}\" if it describes pools")
    return f'write version: "{VERSION}"'


def spec_files(paths: list[Path]) -> list[Path]:
    """Every `*.yaml`/`*.yml` under the given files or directories, sorted (as slogen reads SLO inputs)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml"))
        elif path.exists():
            files.append(path)
    return files


def read_paths(paths: list[Path]) -> tuple[AutoscalingSpec, list[SpecError]]:
    """The pools under the given files or directories, and every problem found (pool names must be unique per
    namespace); the one reading `slogen validate` and `slogen build` share."""
    errors: list[SpecError] = []
    pools: list[Pool] = []
    read: list[Pool] = []
    seen: dict[tuple[str, str], str] = {}
    for file in spec_files(paths):
        try:
            data = file.read_bytes()
        except OSError as exc:
            errors.append(SpecError(str(file), f"cannot read ({exc.strerror or exc})", fix="check the path"))
            continue
        for pool, clean in _read(data, str(file), errors):
            read.append(pool)
            if not clean:
                continue
            key = (pool.namespace, pool.name)
            if key in seen:
                errors.append(SpecError(pool.file, f"pool {pool.name!r} in namespace {pool.namespace!r} is already "
                                        f"defined at {seen[key]}", f"{pool.field}.name", "",
                                        "give each pool its own name", pool.line))
                continue
            seen[key] = pool.origin
            pools.append(pool)
    return AutoscalingSpec(tuple(pools), tuple(read)), errors


def load_paths(paths: list[Path]) -> AutoscalingSpec:
    """read_paths, raising AutoscalingError with every problem."""
    spec, errors = read_paths(paths)
    if errors:
        raise AutoscalingError(errors)
    return spec
