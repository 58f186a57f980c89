"""The inference pool kept apart: two health alerts on who holds the pool's GPUs, when the install declares it.

Why: "train gangs and inference SLOs don't share a pool". A training job or a notebook on a node of the inference
pool takes GPUs the serving replicas and their autoscaler count on and shares the node (PCIe, NVLink, host memory,
the kubelet) with the engines; the SLO alerts follow only once users hurt, and a new replica that cannot
schedule is silent. A serving pod on another pool's node runs outside the pool's taints, policies and capacity
plan.

The series: every GPU series names the pod that holds the GPU or MIG instance (`pod`, `namespace`, `container`,
from the kubelet's pod-resources API; empty when none does or the mapping is down), and an exporter told its
node's pool says it once (`llm_exporter_node_pool_info{hostname, node_pool}`), joined on `hostname` (and
`cluster`, where the rules run over several). The holder series is llm_gpu_memory_total_bytes: the one series
written for every whole GPU and every MIG instance of a reading.

What must not fire: an idle GPU and a GPU whose mapping is down (both have `pod=""`, which no arm matches: a
mapping outage is llm_exporter_gpu_pod_mapping_up's signal, not a foreign pod); a node whose exporter was told no
pool (no info series: nothing is claimed about it); a pod there for less than `for` (scheduled by mistake and
preempted or evicted).

One alert per pod and node, not per GPU (`count by`): a training gang on eight GPUs pages once, with the count.
Severity: a foreign pod on the pool pages (the capacity it takes is the SLOs' headroom, and the boundary it crosses
is a security one); a serving pod off the pool is a ticket (users are served; the placement is wrong).
"""

from __future__ import annotations

from llmslo import conventions as c
from llmslo.conventions import HEALTH as H
from llmslo.durations import format_prometheus_duration
from slogen import promql
from slogen.links import DEFAULT_GRAFANA_URL, FLEET_DASHBOARD_UID, dashboard_url
from slogen.rules.alerts import literal
from slogen.rules.health import CRITICAL, WARNING, HealthAlert, HealthOptions, _alert, _l

TOPIC_POOL_FOREIGN_POD = "pool_foreign_pod"
TOPIC_SERVING_OFF_POOL = "serving_off_pool"
TOPIC_POOL_UNWATCHED = "pool_unwatched"
HOLDER = c.GPU_MEMORY_TOTAL  # written for every whole GPU and MIG instance of a reading, with its holder
JOIN = (c.LABEL_CLUSTER, c.LABEL_HOSTNAME)  # one node (cluster: absent on both sides in a one-cluster Prometheus)
BY_POD = (c.LABEL_CLUSTER, c.LABEL_HOSTNAME, c.LABEL_NAMESPACE, c.LABEL_POD)
HOLDERS_BY = (c.LABEL_CLUSTER, c.LABEL_NODE_POOL, c.LABEL_HOSTNAME, c.LABEL_NAMESPACE, c.LABEL_POD)  # who holds a pool's GPUs


def workload_pods(workloads: tuple[str, ...]) -> str:
    """The pods of the serving workloads, as one RE2 alternation: `<name>-...` (a Deployment's, a StatefulSet's, a
    LeaderWorkerSet's pods); a name's dots matched as dots."""
    return promql.any_of(w.replace(".", "\\.") + "-.+" for w in workloads)


def serving_matchers(opts: HealthOptions) -> list[promql.Matcher]:
    """The serving pods: in the serving namespaces and, where workloads are declared, one of theirs."""
    out = [promql.regex(c.LABEL_NAMESPACE, promql.any_of(opts.serving_namespaces))]
    if opts.serving_workloads:
        out.append(promql.regex(c.LABEL_POD, workload_pods(opts.serving_workloads)))
    return out


def _pool(op: str, pool: str) -> str:
    return promql.selector(c.EXPORTER_NODE_POOL_INFO.name, [promql.matcher(c.LABEL_NODE_POOL, op, pool)])


def foreign_expr(opts: HealthOptions) -> str:
    held = promql.selector(HOLDER.name, [promql.matcher(c.LABEL_POD, "!=", "")])
    serving = promql.selector(HOLDER.name, serving_matchers(opts))
    on = promql.on(JOIN)
    return promql.agg("count", f"\n  ({held} unless {serving})\n  and {on}\n  {_pool('=', opts.isolation_pool)}\n",
                      BY_POD) + "\n"


def off_pool_expr(opts: HealthOptions) -> str:
    serving = promql.selector(HOLDER.name, serving_matchers(opts))
    on = promql.on(JOIN)
    return promql.agg("count", f"\n  {serving}\n  and {on}\n  {_pool('!=', opts.isolation_pool)}\n", BY_POD) + "\n"


def unwatched_expr(opts: HealthOptions) -> str:
    """No exporter says it is on the pool (the pool's DaemonSet is missing or not told its pool: the two alerts
    above see nothing there), or one that does has its GPU-to-pod mapping down (its GPUs' holders are empty, so a
    foreign pod there is invisible). The mapping series and the pool series come from the same exporter, so they
    match on the scrape's target labels: everything but the pool series' own hostname and node_pool."""
    pool = _pool("=", opts.isolation_pool)
    down = f"{c.EXPORTER_GPU_POD_MAPPING_UP.name} == 0"
    return (f"absent({pool})\nor\n({down}\n  and {promql.ignoring((c.LABEL_HOSTNAME, c.LABEL_NODE_POOL))}\n"
            f"  {pool}\n)\n")


def _serving_words(opts: HealthOptions) -> str:
    pods = f", workloads {', '.join(opts.serving_workloads)}" if opts.serving_workloads else ""
    return f"namespaces {', '.join(opts.serving_namespaces)}{pods}"


def isolation_alerts(opts: HealthOptions, base_url: str, extra_labels: dict[str, str] | None = None,
                     grafana_url: str = DEFAULT_GRAFANA_URL) -> list[HealthAlert]:
    """The isolation alerts (H.ISOLATION_ALERTS), none when the build declares no inference pool."""
    if not opts.enabled or not opts.isolation_pool:
        return []
    extra, fleet = dict(extra_labels or {}), literal(dashboard_url(grafana_url, FLEET_DASHBOARD_UID))
    pool, label = opts.isolation_pool, opts.isolation_node_label or "the pool label"
    who = f"{_l(c.LABEL_NAMESPACE)}/{_l(c.LABEL_POD)}"
    node = _l(c.LABEL_HOSTNAME)
    foreign_for = format_prometheus_duration(opts.pool_foreign_pod_for)
    off_for = format_prometheus_duration(opts.serving_off_pool_for)
    unwatched_for = format_prometheus_duration(opts.pool_unwatched_for)
    return [
        _alert(H.POOL_FOREIGN_POD, foreign_expr(opts), opts.pool_foreign_pod_for, CRITICAL,
               f"{who} holds GPUs on {node}, a node of the inference pool {pool}, and is no serving pod.",
               f"For {foreign_for}, {who} has held GPUs of {node}, whose exporter says it is in the node pool {pool} "
               f"({label}={pool}); the serving pods are those of {_serving_words(opts)}. A training job or notebook "
               "there takes GPUs the serving replicas and their autoscaler count on, and shares the node with the "
               "engines. Find what let it schedule there (tolerations, node affinity) and move it off; taint the "
               "pool's nodes if they are not.",
               TOPIC_POOL_FOREIGN_POD,
               f"A pod outside the serving namespaces or workloads holds GPUs on a node of the inference pool {pool}.",
               base_url, extra, fleet),
        _alert(H.POOL_SERVING_OFF_POOL, off_pool_expr(opts), opts.serving_off_pool_for, WARNING,
               f"Serving pod {who} holds GPUs on {node}, outside the inference pool {pool}.",
               f"For {off_for}, serving pod {who} has held GPUs of {node}, whose exporter says it is in another node "
               f"pool than {pool} ({label}). It runs outside the pool's taints, policies and capacity plan, on GPUs "
               "another pool counts on. Give its workload the pool's nodeSelector and toleration, and let it "
               "reschedule.",
               TOPIC_SERVING_OFF_POOL,
               f"A serving pod holds GPUs on a node outside the inference pool {pool}.",
               base_url, extra, fleet),
        _alert(H.POOL_UNWATCHED, unwatched_expr(opts), opts.pool_unwatched_for, WARNING,
               f"The inference pool {pool} is not watched: no exporter says it is on it, or one's GPU-to-pod mapping "
               "is down.",
               f"For {unwatched_for}, either no exporter has said it reads the GPUs of a node of the pool {pool} (the "
               f"pool's exporter DaemonSet is missing, not scheduled on nodes labelled {label}={pool}, or not told its "
               "pool), or an exporter on the pool cannot map its GPUs to pods (the podmap relay or the kubelet's "
               f"pod-resources socket). Meanwhile {H.POOL_FOREIGN_POD} cannot fire there: a training pod on the pool "
               "would go unseen.",
               TOPIC_POOL_UNWATCHED,
               f"The isolation alerts of the inference pool {pool} are blind.",
               base_url, extra, fleet),
    ]


def holders_by_pool(matchers: list[promql.Matcher] | None = None) -> str:
    """GPUs (and MIG instances) held per pool, node and pod (HOLDERS_BY), for the runbooks and the fleet dashboard:
    every holder (its series narrowed by `matchers`) on a node whose exporter says its pool (`node_pool` joined
    from llm_exporter_node_pool_info, one per node: `max by` keeps an exporter's restart from matching twice)."""
    held = promql.selector(HOLDER.name, [*(matchers or []), promql.matcher(c.LABEL_POD, "!=", "")])
    pools = promql.agg("max", promql.selector(c.EXPORTER_NODE_POOL_INFO.name), (*JOIN, c.LABEL_NODE_POOL))
    return promql.agg("count", f"{held} * {promql.on(JOIN)} group_left ({c.LABEL_NODE_POOL}) {pools}", HOLDERS_BY)


def nodes_by_pool() -> str:
    """How many GPU nodes each pool has, as their exporters say."""
    return promql.agg("count", promql.selector(c.EXPORTER_NODE_POOL_INFO.name), (c.LABEL_CLUSTER, c.LABEL_NODE_POOL))
