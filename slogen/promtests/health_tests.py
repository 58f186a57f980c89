"""promtool unit tests for the health alerts: each condition staged, on one-minute steps.

Every test starts healthy, then breaks one series (a GPU lost, an XID, a KV cache filling
while requests queue, a tap refusing requests at its own limits, ...) next to a healthy or
almost-broken neighbour that must stay quiet. It asserts: nothing fires before the condition
holds, nothing fires one step before the alert's `for` has passed, and then exactly the broken
series fires, with all its labels (including `cluster`) and the annotations expanded for it;
the GPU-error and tap-refusal alerts also resolve.
Thresholds come from the options, so the tests follow any `--kv-usage-threshold` etc.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmslo import conventions as c
from llmslo.conventions import HEALTH as H
from llmslo.durations import MINUTE
from llmslo.gofloat import go_g
from slogen.gofmt import label_filter
from slogen.rules.alerts import rendered
from slogen.rules.health import HealthAlert, HealthOptions
from slogen.rules.scope import fired_labels

STEP = "1m"
CLUSTER = "east"  # a federation-style label the alerts must pass through
GPU_LABELS = {c.LABEL_GPU: "0", c.LABEL_UUID: "GPU-5f0e2b1c-0000-4000-8000-000000000000",
              c.LABEL_MODEL_NAME: "NVIDIA H100 80GB HBM3", c.LABEL_PCI_BUS_ID: "00000000:18:00.0",
              c.LABEL_HOSTNAME: "gpu-node-a", c.LABEL_CLUSTER: CLUSTER}
ENGINE_LABELS = {c.LABEL_ENGINE: "vllm", c.LABEL_MODEL: "llama-3-8b", c.LABEL_POD: "vllm-0",
                 c.LABEL_NAMESPACE: "llm", c.LABEL_NODE: "gpu-node-a", c.LABEL_CLUSTER: CLUSTER}
TARGET_LABELS = {c.LABEL_TARGET: "llm/vllm-0:8000", c.LABEL_ENGINE: "vllm", c.LABEL_CLUSTER: CLUSTER}
# A tap sidecar's series as the node exporter passes them through (engine="tap", the pod's identity).
TAP_LABELS = {**ENGINE_LABELS, c.LABEL_ENGINE: "tap"}


@dataclass(frozen=True)
class Scenario:
    """Input series (name, labels, promtool values: `axn` is n+1 samples, `_xn` n missing ones) and the
    minutes at which to check the alert."""

    title: str
    series: tuple[tuple[str, dict[str, str], str], ...]
    fires: dict[str, str]  # labels of the one series that must fire
    quiet: tuple[int, ...]  # minutes at which nothing fires
    firing: tuple[int, ...]  # minutes at which exactly `fires` fires


def _m(ms: int) -> int:
    return ms // MINUTE


def _other(labels: dict[str, str], **changes: str) -> dict[str, str]:
    return {**labels, **changes}


def scenarios(opts: HealthOptions) -> dict[str, Scenario]:
    lost, down = _m(opts.gpu_lost_for), _m(opts.target_down_for)
    window, kv_for, pre_for = _m(opts.gpu_error_window), _m(opts.kv_saturated_for), _m(opts.preemption_for)
    gpu1 = _other(GPU_LABELS, **{c.LABEL_GPU: "1", c.LABEL_UUID: "GPU-5f0e2b1c-0000-4000-8000-000000000001"})
    xid = {**GPU_LABELS, c.LABEL_XID: "79"}
    ecc = {**GPU_LABELS, c.LABEL_ECC_TYPE: H.ECC_UNCORRECTED}
    pod1 = _other(ENGINE_LABELS, **{c.LABEL_POD: "vllm-1"})
    high = go_g(round(opts.kv_usage_threshold + (1 - opts.kv_usage_threshold) / 2, 6))
    low = go_g(round(opts.kv_usage_threshold / 2, 6))
    # 2x the threshold from minute 10: the 5m rate crosses it once three increments are in the window.
    per_step = go_g(round(2 * opts.preemption_rate * 60, 6))
    onset = 10 + 2
    # Tap refusals: one step's worth over the window is already twice the threshold (1 a minute at the
    # default threshold 0), so the rate crosses it at the first refusal and stays over it.
    ref_window, ref_for = _m(opts.tap_refusal_window), _m(opts.tap_refusal_for)
    # Whole numbers, so that promtool's running sums are exact and the counter stays flat once refusals stop.
    ref_step = max(1, math.ceil(2 * opts.tap_refusal_rate * opts.tap_refusal_window / 1000))
    ref, ref_last = str(ref_step), str(ref_step * (ref_for + 5))  # refusing from 10m to 14m + for, then none
    ref_stop = 14 + ref_for
    ref_end = ref_stop + ref_window + 5  # the last minute of every refusal series
    capacity = {**TAP_LABELS, c.LABEL_REASON: c.REFUSED_CONNECTION_LIMIT}
    clients = tuple((c.TAP_REFUSALS.name, {**TAP_LABELS, c.LABEL_REASON: reason}, f"0+{10 * ref_step}x{ref_end}")
                    for reason in c.REFUSED_REASONS if reason not in c.REFUSED_CAPACITY_REASONS)
    blip = {**TAP_LABELS, c.LABEL_POD: "vllm-1", c.LABEL_REASON: c.REFUSED_BODY_MEMORY}
    # Config drift: vllm-1 runs on other files throughout; vllm-0 reloads from the old files to the rules' at 5m
    # (its old series goes stale within the 5m lookback, well inside `for`) and stays quiet.
    drift_for = _m(opts.tap_config_drift_for)
    old_hash = next(h for h in ("0" * 16, "1" * 16) if h != opts.tap_config_hash)
    drifted = {**TAP_LABELS, c.LABEL_POD: "vllm-1", c.LABEL_CONFIG_HASH: old_hash}
    reloaded_old = {**TAP_LABELS, c.LABEL_CONFIG_HASH: old_hash}
    reloaded_new = {**TAP_LABELS, c.LABEL_CONFIG_HASH: opts.tap_config_hash}
    return {
        H.GPU_LOST: Scenario(
            f"GPU 0 lost at 5m fires after {lost}m; GPU 1 stays up",
            ((c.GPU_UP.name, GPU_LABELS, f"1x4 0x{lost + 10}"), (c.GPU_UP.name, gpu1, f"1x{lost + 15}")),
            GPU_LABELS, quiet=(4, 5 + lost - 1), firing=(5 + lost,)),
        H.GPU_XID_ERRORS: Scenario(
            "first XID 79 at 5m fires at once and resolves after the window; a second one fires again",
            ((c.GPU_XID_ERRORS.name, xid, f"_x5 1x{window + 4} 2x10"),),
            xid, quiet=(4, 5 + window + 1), firing=(5, 5 + window + 5)),
        H.GPU_ECC_UNCORRECTED: Scenario(
            "an uncorrected ECC error at 10m fires at once and resolves after the window; corrected ones do not",
            ((c.GPU_ECC_ERRORS.name, ecc, f"0x9 1x{window + 10}"),
             (c.GPU_ECC_ERRORS.name, {**GPU_LABELS, c.LABEL_ECC_TYPE: "corrected"}, f"0x4 5x{window + 15}")),
            ecc, quiet=(9, 10 + window + 1), firing=(10,)),
        H.ENGINE_TARGET_DOWN: Scenario(
            f"target unreadable from 5m fires after {down}m; another target stays up",
            ((c.EXPORTER_TARGET_UP.name, TARGET_LABELS, f"1x4 0x{down + 10}"),
             (c.EXPORTER_TARGET_UP.name, _other(TARGET_LABELS, **{c.LABEL_TARGET: "llm/vllm-1:8000"}), f"1x{down + 15}")),
            TARGET_LABELS, quiet=(4, 5 + down - 1), firing=(5 + down,)),
        H.KV_CACHE_SATURATED: Scenario(
            f"KV full from 5m, queue from 10m fires after {kv_for}m; a full cache without a queue does not",
            ((c.KV_CACHE_USAGE.name, ENGINE_LABELS, f"{low}x4 {high}x{kv_for + 15}"),
             (c.REQUESTS_WAITING.name, ENGINE_LABELS, f"0x9 3x{kv_for + 10}"),
             (c.KV_CACHE_USAGE.name, pod1, f"{high}x{kv_for + 20}"),
             (c.REQUESTS_WAITING.name, pod1, f"0x{kv_for + 20}")),
            ENGINE_LABELS, quiet=(9, 10 + kv_for - 1), firing=(10 + kv_for,)),
        H.PREEMPTION_STORM: Scenario(
            f"preempting at twice the threshold from 10m fires after {pre_for}m; a slow preempter does not",
            ((c.PREEMPTIONS.name, ENGINE_LABELS, f"0x9 {per_step}+{per_step}x{pre_for + 10}"),
             (c.PREEMPTIONS.name, pod1, f"0+1x{pre_for + 20}")),
            ENGINE_LABELS, quiet=(onset - 1, onset + pre_for - 1), firing=(onset + pre_for,)),
        H.ENGINE_REFUSING_REQUESTS: _engine_refusals(opts),
        H.TAP_REFUSING_REQUESTS: Scenario(
            f"refusing at the connection limit from 10m fires after {ref_for}m and resolves once refusals stop; "
            "clients' malformed, slow, oversized requests do not; one burst at the body-memory cap on another tap does not",
            ((c.TAP_REFUSALS.name, capacity, f"0x9 {ref}+{ref}x{ref_stop - 10} {ref_last}x{ref_end - ref_stop - 1}"),
             *clients,
             (c.TAP_REFUSALS.name, blip, f"0x9 {ref}x{ref_end - 10}")),
            capacity, quiet=(9, 10 + ref_for - 1, ref_stop + ref_window + 1),
            firing=(10 + ref_for, ref_stop)),
        H.TAP_CONFIG_DRIFT: Scenario(
            f"a tap on other SLO files fires after {drift_for}m; a tap that reloads to the rules' files at 5m does not",
            ((c.TAP_CONFIG_INFO.name, drifted, f"1x{drift_for + 10}"),
             (c.TAP_CONFIG_INFO.name, reloaded_old, "1x4"),
             (c.TAP_CONFIG_INFO.name, reloaded_new, f"_x5 1x{drift_for + 5}")),
            drifted, quiet=(0, drift_for - 1), firing=(drift_for, drift_for + 5)),
    }


def _engine_refusals(opts: HealthOptions) -> Scenario:
    """vllm-0 refuses at its queue cap from 10m (twice the threshold) until 14m + for; next to it, refusals that are a
    client's own fault, a counter that restarts (0 from 12m), one of several summed counters restarting (a partial
    drop, which rate() reads as an increase for one window) and one burst on another engine: none of those fire."""
    window, for_ = _m(opts.engine_refusal_window), _m(opts.engine_refusal_for)
    step = max(1, math.ceil(2 * opts.engine_refusal_rate * opts.engine_refusal_window / 1000))  # whole numbers
    stop = 14 + for_
    end = stop + window + 5
    refused = {**ENGINE_LABELS, c.LABEL_REASON: c.VLLM.ADMISSION_REJECTION_REASONS[0]}
    pod = {**ENGINE_LABELS, c.LABEL_REASON: c.VLLM.ADMISSION_REJECTION_REASONS[1]}
    client = tuple((c.REQUESTS_REJECTED.name, {**ENGINE_LABELS, c.LABEL_ENGINE: engine, c.LABEL_REASON: reason},
                    f"0+{10 * step}x{end}") for engine, reason in (("tgi", "validation"), ("trtllm-serve", "http_400")))
    return Scenario(
        f"refusing at vLLM's queue cap from 10m fires after {for_}m and resolves once refusals stop; a client's own "
        "refusals, a restart, a partial counter reset and one burst do not",
        ((c.REQUESTS_REJECTED.name, refused, f"0x9 {step}+{step}x{stop - 10} {step * (for_ + 5)}x{end - stop - 1}"),
         *client,
         (c.REQUESTS_REJECTED.name, {**pod, c.LABEL_POD: "vllm-1"}, f"{50 * step}x11 0x{end - 12}"),
         (c.REQUESTS_REJECTED.name, {**pod, c.LABEL_POD: "vllm-2"}, f"{150 * step}x11 {100 * step}x{end - 12}"),
         (c.REQUESTS_REJECTED.name, {**pod, c.LABEL_POD: "vllm-3"}, f"0x9 {step}x{end - 10}")),
        refused, quiet=(9, 10 + for_ - 1, stop + window + 1), firing=(10 + for_, stop))


def expand(template: str, labels: dict[str, str]) -> str:
    """What Prometheus makes of an annotation that only uses `{{ $labels.x }}`."""
    for key, value in labels.items():
        template = template.replace(f"{{{{ $labels.{key} }}}}", value)
    return template


def alert_check(alert: HealthAlert, minute: int, fires: dict[str, str] | None) -> dict:
    """One promtool alert check: at `minute`, `alert` fires with `fires`' labels, or (None) does not fire."""
    rule = alert.rule
    expected = []
    if fires is not None:
        expected.append({"exp_labels": fired_labels(fires, rule),
                         "exp_annotations": {k: rendered(expand(v, fires)) for k, v in sorted(rule.annotations.items())}})
    return {"eval_time": f"{minute}m", "alertname": rule.alert, "exp_alerts": expected}


def health_tests(alerts: list[HealthAlert], opts: HealthOptions, rule_file: str,
                 extra: dict[str, Scenario] | None = None) -> dict:
    """The promtool test-file document for the health rule file; `extra`: the scenarios of alerts staged elsewhere
    (isolation_tests.py)."""
    staged = {**scenarios(opts), **(extra or {})}
    tests: list[dict[str, Any]] = []
    for alert in alerts:
        s = staged[alert.rule.alert]
        checks = [alert_check(alert, m, None) for m in s.quiet] + [alert_check(alert, m, s.fires) for m in s.firing]
        tests.append({
            "name": f"{alert.rule.alert}: {s.title}",
            "interval": STEP,
            "input_series": [{"series": name + label_filter(labels), "values": values} for name, labels, values in s.series],
            "alert_rule_test": sorted(checks, key=lambda x: int(x["eval_time"][:-1])),
        })
    return {"rule_files": [rule_file], "evaluation_interval": STEP, "tests": tests}
