"""Capacity and health alerts: a small fixed set, generated next to the SLO burn-rate rules.

Why: burn-rate alerts say users are hurting; these say why, or warn before they do. A lost GPU,
fresh XID or uncorrected ECC errors, an engine the exporter cannot read, a KV cache with no
seats left while requests queue, a preemption storm, a goodput tap refusing requests because its
own limits are reached (503s that never reach the engine, so no SLO counts them). They are not SLOs (no budget, no tiers),
so they get their own rule group and file, but the same labels and annotations as the SLO
alerts: kube-prometheus `severity`, `summary`, `description`, a `runbook_url` following
`runbook_path()` and a `dashboard` link (the fleet serving dashboard).

No expression aggregates: each alert is per series (one GPU, one engine, one target), so every
label on the series (`cluster`, `namespace`, `pod`, `gpu`, `xid`, ...) reaches the alert, the
same effect as the SLO alerts' `max without (sloth_window)`. Plain PromQL only, so the rules
run unchanged on Prometheus, Thanos Ruler and Mimir.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmslo import conventions as c
from llmslo.conventions import HEALTH as H
from llmslo.durations import MINUTE, format_prometheus_duration
from llmslo.gofloat import go_g
from slogen import promql
from slogen.links import DEFAULT_GRAFANA_URL, FLEET_DASHBOARD_UID, dashboard_url
from slogen.model import Rule, RuleGroup
from slogen.rules import knobs
from slogen.rules.alerts import SEVERITY, literal, runbook_url
from slogen.rules.knobs import knob

CRITICAL = SEVERITY["page"]
WARNING = SEVERITY["ticket"]
XID_HISTORY = "1h"  # an XID series absent over the hour before the window is a new XID code on that GPU

# Runbook topics (slogen/templates/runbook_<topic>.md.j2), by alert.
TOPIC_GPU_HEALTH = "gpu_health"
TOPIC_KV_SATURATION = "kv_saturation"
TOPIC_TARGET_DOWN = "target_down"
TOPIC_TAP_REFUSALS = "tap_refusals"
TOPIC_TAP_CONFIG_DRIFT = "tap_config_drift"
TOPIC_ENGINE_REFUSALS = "engine_refusals"


@dataclass(frozen=True)
class HealthOptions:
    """Thresholds of the health alerts (`slogen build --kv-usage-threshold ...`); durations in ms. Each
    threshold's row (flag, help, range) is its field's knob (slogen/rules/knobs.py)."""

    enabled: bool = True
    gpu_lost_for: int = knob(2 * MINUTE, "DURATION", "LLMGpuLost", "how long llm_gpu_up is 0 (NVML lost the GPU, "
                             "or the exporter's GPU reads fail) before it fires")
    gpu_error_window: int = knob(10 * MINUTE, "WINDOW", "LLMGpuXidErrors, LLMGpuEccUncorrectedErrors",
                                 "window of the increase of XID or uncorrected-ECC errors (any increase fires)")
    target_down_for: int = knob(5 * MINUTE, "DURATION", "LLMEngineTargetDown",
                                "how long an engine's /metrics is unreadable before it fires")
    kv_usage_threshold: float = knob(0.95, "RATIO", "LLMKVCacheSaturated",
                                     "KV-cache usage ratio (KV blocks in use) above which, with requests waiting, "
                                     "it fires after kv_saturated_for", high=1.0,
                                     accepts="a ratio between 0 and 1, e.g. 0.95")
    kv_saturated_for: int = knob(10 * MINUTE, "DURATION", "LLMKVCacheSaturated", "how long before it fires")
    preemption_rate: float = knob(1.0, "PER_SECOND", "LLMPreemptionStorm",
                                  "preemptions per second per engine over preemption_window above which it fires "
                                  "(a preempted request loses its KV and recomputes it: TTFT and TPOT both suffer)",
                                  accepts="a positive rate per second, e.g. 1")
    preemption_window: int = knob(5 * MINUTE, "WINDOW", "LLMPreemptionStorm", "rate window")
    preemption_for: int = knob(10 * MINUTE, "DURATION", "LLMPreemptionStorm", "how long before it fires")
    # The engine's own refusals for its capacity (conventions.ENGINE_REFUSAL_REASONS): any sustained rate, by default.
    engine_refusal_rate: float = knob(0.0, "PER_SECOND", "LLMEngineRefusingRequests",
                                      "refusals per second per engine and reason, at the engine's own queue caps or "
                                      "overload, above which it fires (0: any sustained refusal)", low_open=False,
                                      accepts="a rate per second, 0 (any refusal) or more")
    engine_refusal_window: int = knob(5 * MINUTE, "WINDOW", "LLMEngineRefusingRequests", "rate window")
    engine_refusal_for: int = knob(10 * MINUTE, "DURATION", "LLMEngineRefusingRequests",
                                   "how long before it fires, longer than the window, so one burst of refusals (or "
                                   "one of several summed counters restarting) does not fire it")
    # Tap refusals for its own capacity (conventions.REFUSED_CAPACITY_REASONS): any sustained rate, by default.
    tap_refusal_rate: float = knob(0.0, "PER_SECOND", "LLMTapRefusingRequests",
                                   "refusals per second per tap and reason, at its connection or body-memory limit, "
                                   "above which it fires (0: any sustained refusal)", low_open=False,
                                   accepts="a rate per second, 0 (any refusal) or more")
    tap_refusal_window: int = knob(5 * MINUTE, "WINDOW", "LLMTapRefusingRequests", "rate window")
    tap_refusal_for: int = knob(10 * MINUTE, "DURATION", "LLMTapRefusingRequests",
                                "how long before it fires, longer than the window, so one burst of refusals does "
                                "not fire it")
    # The content hash of the SLO files the rules are built from (llmslo.confighash; set by the build from
    # its inputs, not a flag): a tap running on other files fires TAP_CONFIG_DRIFT after tap_config_drift_for.
    tap_config_hash: str = ""
    tap_config_drift_for: int = knob(15 * MINUTE, "DURATION", "LLMTapConfigDrift",
                                     "how long a tap runs on other SLO files than the rules were built from before it "
                                     "fires (long enough for the kubelet to update a mounted ConfigMap, about a "
                                     "minute, and the tap to reload it)")
    # The inference pool's isolation (slogen/rules/isolation.py; set by the build from llmslo.yaml `isolation:`,
    # not flags): no alerts while isolation_pool is empty.
    isolation_pool: str = ""
    serving_namespaces: tuple[str, ...] = ()
    serving_workloads: tuple[str, ...] = ()  # their pods are named <workload>-...; empty: every pod there serves
    isolation_node_label: str = ""
    pool_foreign_pod_for: int = knob(10 * MINUTE, "DURATION", "LLMInferencePoolForeignPod",
                                     "how long a pod outside the serving namespaces or workloads holds a GPU of the "
                                     "inference pool before it pages (longer than a pod scheduled there by mistake "
                                     "takes to be preempted or evicted)")
    serving_off_pool_for: int = knob(30 * MINUTE, "DURATION", "LLMServingPodOffPool",
                                     "how long a serving pod holds a GPU on a node of another pool before it fires")
    pool_unwatched_for: int = knob(30 * MINUTE, "DURATION", "LLMInferencePoolUnwatched",
                                   "how long no exporter says it is on the inference pool, or a pool node's GPU-to-pod "
                                   "mapping is down, before it fires (longer than a DaemonSet rollout)")
    # The tap injector (slogen/rules/injector.py; on when llmslo.yaml has `tapInjector: true`, set by the build).
    tap_injector: bool = False
    tap_injector_window: int = knob(10 * MINUTE, "WINDOW", "LLMTapInjectorFailing", "rate window of its failed reviews")
    tap_injector_for: int = knob(15 * MINUTE, "DURATION", "LLMTapInjectorFailing",
                                 "how long the injector is unscraped or fails reviews before it fires (longer than a "
                                 "rollout of its two replicas)")

    def problems(self) -> list[tuple[str, str]]:
        """(option, what is wrong and the fix) for every bad value; empty when usable."""
        out = knobs.problems(self)
        out += _for_after_window("engine_refusal", self.engine_refusal_window, self.engine_refusal_for)
        out += _for_after_window("tap_injector", self.tap_injector_window, self.tap_injector_for)
        out += _for_after_window("tap_refusal", self.tap_refusal_window, self.tap_refusal_for)
        return out


def _for_after_window(prefix: str, window: int, for_: int) -> list[tuple[str, str]]:
    """`<prefix>_for` must outlast `<prefix>_window`, else one burst keeps the rate over 0 for the whole `for`."""
    if 0 < window and 0 < for_ <= window:
        return [(f"{prefix}_for", f"is {format_prometheus_duration(for_)}, not longer than {prefix}_window "
                 f"({format_prometheus_duration(window)}), so one burst of refusals would fire it; write a longer "
                 "duration, e.g. twice the window")]
    return []


@dataclass(frozen=True)
class HealthAlert:
    """One health alert: its rule, and what its runbook says about it (plain text, no templates)."""

    rule: Rule
    topic: str
    condition: str  # the expression on one line, for the runbook
    runbook_summary: str


def _l(label: str) -> str:
    """A Prometheus alert template reference to one of the series' labels."""
    return f"{{{{ $labels.{label} }}}}"


def _one_line(expr: str) -> str:
    return " ".join(expr.split())


def _alert(name: str, expr: str, for_ms: int, severity: str, summary: str, description: str, topic: str,
           runbook_summary: str, base_url: str, extra_labels: dict[str, str], dashboard: str,
           group: str = H.GROUP) -> HealthAlert:
    """`group` stands for the service in a `--runbook-url` template's {{service}}: these alerts have none."""
    rule = Rule(expr=expr, alert=name, for_=format_prometheus_duration(for_ms) if for_ms else "",
                labels={**extra_labels, c.SLO.LABEL_ALERT_SEVERITY: severity},
                annotations={"summary": summary, "description": description,
                             "runbook_url": runbook_url(name, base_url, group), "dashboard": dashboard})
    return HealthAlert(rule, topic, _one_line(expr), runbook_summary)


def health_alerts(opts: HealthOptions, base_url: str, extra_labels: dict[str, str] | None = None,
                  grafana_url: str = DEFAULT_GRAFANA_URL) -> list[HealthAlert]:
    """The alerts, in a fixed order (`HEALTH.ALERTS`); each links the fleet serving dashboard."""
    extra = dict(extra_labels or {})
    fleet = literal(dashboard_url(grafana_url, FLEET_DASHBOARD_UID))
    return [*_gpu_alerts(opts, base_url, extra, fleet), *_engine_alerts(opts, base_url, extra, fleet),
            *_tap_alerts(opts, base_url, extra, fleet)]


def _gpu_alerts(opts: HealthOptions, base_url: str, extra: dict[str, str], fleet: str) -> list[HealthAlert]:
    """The GPU is gone, or reports hardware errors."""
    gpu = f"GPU {_l(c.LABEL_GPU)} ({_l(c.LABEL_UUID)}) on {_l(c.LABEL_HOSTNAME)}"
    window = format_prometheus_duration(opts.gpu_error_window)
    xid = c.GPU_XID_ERRORS.name
    ecc = f'{c.GPU_ECC_ERRORS.name}{{{c.LABEL_ECC_TYPE}="{H.ECC_UNCORRECTED}"}}'
    return [
        _alert(H.GPU_LOST, f"{c.GPU_UP.name} == 0\n", opts.gpu_lost_for, CRITICAL,
               f"{gpu} is lost.",
               f"NVML has not answered for this GPU for {format_prometheus_duration(opts.gpu_lost_for)} ({c.GPU_UP.name} is 0). "
               "The engine replicas on it are failing or stalled: cordon the node and move them.",
               TOPIC_GPU_HEALTH, "A GPU stopped answering NVML: the replicas on it are failing or stalled.",
               base_url, extra, fleet),
        # A new XID code on a GPU appears as a counter already at 1, which increase() cannot see:
        # the `unless` arm catches a series absent over the hour before the window.
        _alert(H.GPU_XID_ERRORS,
               f"{promql.increase(xid, window)} > 0\nor\n({xid} unless {promql.max_over_time(xid, XID_HISTORY, window)})\n",
               0, WARNING,
               f"{gpu} reported XID {_l(c.LABEL_XID)}.",
               f"The driver reported XID {_l(c.LABEL_XID)} on this GPU in the last {window}. XIDs 48, 63, 64, 74, 79, 94 "
               "and 95 usually mean a failing GPU or link; look up the code before the node takes more traffic.",
               TOPIC_GPU_HEALTH, "The driver reported XID errors on a GPU.", base_url, extra, fleet),
        _alert(H.GPU_ECC_UNCORRECTED, f"{promql.increase(ecc, window)} > 0\n", 0, CRITICAL,
               f"{gpu} has new uncorrected ECC errors.",
               f"Uncorrected (double-bit) ECC errors rose on this GPU in the last {window}. Data in HBM was lost: "
               "the processes using it may have crashed or produced garbage. Drain the node and hand it to hardware.",
               TOPIC_GPU_HEALTH, "A GPU has new uncorrected ECC errors: data in HBM was lost.", base_url, extra, fleet),
    ]


def _engine_alerts(opts: HealthOptions, base_url: str, extra: dict[str, str], fleet: str) -> list[HealthAlert]:
    """The exporter cannot read an engine, or the engine is out of KV cache."""
    engine = f"{_l(c.LABEL_ENGINE)} engine {_l(c.LABEL_NAMESPACE)}/{_l(c.LABEL_POD)} ({_l(c.LABEL_MODEL)})"
    kv_thr = go_g(opts.kv_usage_threshold)
    rate_thr = go_g(opts.preemption_rate)
    pre_window = format_prometheus_duration(opts.preemption_window)
    return [
        _alert(H.ENGINE_TARGET_DOWN, f"{c.EXPORTER_TARGET_UP.name} == 0\n", opts.target_down_for, WARNING,
               f"The exporter cannot read {_l(c.LABEL_ENGINE)} target {_l(c.LABEL_TARGET)}.",
               f"The exporter's scrapes of this engine have failed for {format_prometheus_duration(opts.target_down_for)} "
               f"({c.EXPORTER_TARGET_UP.name} is 0; {c.EXPORTER_LAST_ERROR.name} says why). The engine may be down, "
               "and its SLO and capacity series are missing meanwhile.",
               TOPIC_TARGET_DOWN, "The exporter cannot scrape an engine's metrics page.", base_url, extra, fleet),
        _alert(H.KV_CACHE_SATURATED,
               f"{c.KV_CACHE_USAGE.name} > {kv_thr}\nand\n{c.REQUESTS_WAITING.name} > 0\n", opts.kv_saturated_for, WARNING,
               f"{engine}: KV cache full with requests queued.",
               f"KV-cache usage has been above {kv_thr} with requests waiting for {format_prometheus_duration(opts.kv_saturated_for)}: "
               "the engine has no seats left, so new requests queue (TTFT rises) and running ones are preempted. "
               "Add replicas or give each more KV blocks.",
               TOPIC_KV_SATURATION,
               f"An engine's KV cache is over {kv_thr} full while requests wait: no seats left, the queue is building.",
               base_url, extra, fleet),
        _alert(H.PREEMPTION_STORM, f"{promql.rate(c.PREEMPTIONS.name, pre_window)} > {rate_thr}\n", opts.preemption_for, WARNING,
               f"{engine} preempts more than {rate_thr} requests/s.",
               f"The engine has preempted more than {rate_thr} running requests per second (over {pre_window}) for "
               f"{format_prometheus_duration(opts.preemption_for)}: it runs out of KV blocks mid-generation and recomputes or swaps. "
               "TPOT and throughput suffer for every request on it.",
               TOPIC_KV_SATURATION,
               f"An engine preempts more than {rate_thr} running requests per second: KV blocks run out mid-generation.",
               base_url, extra, fleet),
        _engine_refusals(opts, base_url, extra, fleet, engine),
    ]


def _engine_refusals(opts: HealthOptions, base_url: str, extra: dict[str, str], fleet: str, engine: str) -> HealthAlert:
    """The engine itself refuses requests at its own limits (vLLM's --max-num-queued-*, TGI's overload, ...).

    A ticket, not a page: each refusal is also an `error` the availability SLO counts, so lasting harm pages there;
    this says why. Never a client's own 4xx (not in ENGINE_REFUSAL_REASONS). Per series, so per engine and reason."""
    refused = f'{c.REQUESTS_REJECTED.name}{{{c.LABEL_REASON}=~"{"|".join(c.ENGINE_REFUSAL_REASONS)}"}}'
    window, for_ = format_prometheus_duration(opts.engine_refusal_window), format_prometheus_duration(opts.engine_refusal_for)
    thr = go_g(opts.engine_refusal_rate)
    how = f"in every {window} window" if opts.engine_refusal_rate == 0 else f"at more than {thr} per second (over {window})"
    return _alert(
        H.ENGINE_REFUSING_REQUESTS, f"{promql.rate(refused, window)} > {thr}\n", opts.engine_refusal_for, WARNING,
        f"{engine} refuses requests at its own limit ({_l(c.LABEL_REASON)}).",
        f"The engine has refused requests before admitting them (reason {_l(c.LABEL_REASON)}) {how} for the last "
        f"{for_}: vLLM's max_num_queued_reqs / max_num_queued_tokens are its --max-num-queued-reqs / "
        "--max-num-queued-tokens caps (a 503), TGI's overloaded and trtllm-serve's http_429 / http_503 its overload, "
        "Triton's REJECTED its queue policy, other a cap this exporter does not know yet. Clients get errors the "
        "availability SLO counts; raise the cap if it sits below what the engine can serve, else add replicas.",
        TOPIC_ENGINE_REFUSALS,
        "An engine refuses requests at its own queue caps or overload: clients get 503s or 429s before the engine "
        "admits them.",
        base_url, extra, fleet)


def _tap_alerts(opts: HealthOptions, base_url: str, extra: dict[str, str], fleet: str) -> list[HealthAlert]:
    """A goodput tap turns clients away at its own limits, or runs on other SLO files than the rules."""
    tap = f"Goodput tap {_l(c.LABEL_NAMESPACE)}/{_l(c.LABEL_POD)}"
    refusals = f'{c.TAP_REFUSALS.name}{{{c.LABEL_REASON}=~"{"|".join(c.REFUSED_CAPACITY_REASONS)}"}}'
    ref_window, ref_for = format_prometheus_duration(opts.tap_refusal_window), format_prometheus_duration(opts.tap_refusal_for)
    ref_thr = go_g(opts.tap_refusal_rate)
    ref_how = (f"in every {ref_window} window" if opts.tap_refusal_rate == 0
               else f"at more than {ref_thr} per second (over {ref_window})")
    return [
        _alert(H.TAP_REFUSING_REQUESTS, f"{promql.rate(refusals, ref_window)} > {ref_thr}\n", opts.tap_refusal_for, WARNING,
               f"{tap} refuses requests at its own limit ({_l(c.LABEL_REASON)}).",
               f"The tap has refused requests (reason {_l(c.LABEL_REASON)}) {ref_how} for the last {ref_for} "
               f"({c.REFUSED_CONNECTION_LIMIT}: --max-connections reached; {c.REFUSED_BODY_MEMORY}: the request bodies "
               "it holds are at --max-buffered-body-bytes). Clients get 503s that never reach the engine and that "
               "no SLO counts, so the SLOs can look healthy meanwhile. Raise --max-connections or "
               "--max-buffered-body-bytes, add tap --workers or engine replicas, or find the client holding "
               "connections or sending huge bodies (docs/metrics.md, Relaying, \"Abuse limits\").",
               TOPIC_TAP_REFUSALS,
               "A goodput tap refuses requests because its own connection or body-memory limit is reached: clients "
               "get 503s that never reach the engine, and no SLO counts them.",
               base_url, extra, fleet),
        _alert(H.TAP_CONFIG_DRIFT, f'{c.TAP_CONFIG_INFO.name}{{{c.LABEL_CONFIG_HASH}!="{opts.tap_config_hash}"}}\n',
               opts.tap_config_drift_for, WARNING,
               f"{tap} runs on other SLO files than the rules.",
               f"The tap's SLO files hash to {_l(c.LABEL_CONFIG_HASH)}; the rules were built from files hashing to "
               f"{opts.tap_config_hash or '(none)'} (llm_tap_config_info, for {format_prometheus_duration(opts.tap_config_drift_for)}). "
               "Its classes and histogram bucket edges may not be the rules' thresholds, so its latency and goodput "
               "SLIs are not what the SLOs say. Apply the ConfigMap slogen generated (deploy/generated/tap) in its "
               "namespace; if it is applied, the tap's log says why it did not reload (event=tap_slo_reload_failed).",
               TOPIC_TAP_CONFIG_DRIFT,
               "A goodput tap runs on other SLO files than the ones the rules were built from: its thresholds and "
               "bucket edges may not be the ones the rules query.",
               base_url, extra, fleet),
    ]


def health_group(alerts: list[HealthAlert]) -> RuleGroup:
    return RuleGroup(H.GROUP, [a.rule for a in alerts])
