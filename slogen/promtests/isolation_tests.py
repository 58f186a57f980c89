"""promtool unit tests for the inference pool's isolation alerts (slogen/rules/isolation.py), staged per build.

Foreign pod: a training pod lands on two GPUs of a pool node at 5m and leaves (its series end in staleness markers,
as when the kubelet frees the GPUs) after paging; beside it, on the same node, a serving pod and an idle GPU; on a
second pool node, a foreign pod whose mapping goes down (the exporter's labels turn empty) before `for` has passed;
on a node whose exporter was told no pool, another foreign pod. Only the training pod fires, once for its two GPUs,
and it clears when it leaves.
Serving pod off the pool: a serving pod on a node of another pool fires after `for`; a serving pod on the pool, one
on a node told no pool, and a training pod on its own pool do not.
"""

from __future__ import annotations

from llmslo import conventions as c
from llmslo.conventions import HEALTH as H
from slogen.promtests.health_tests import CLUSTER, Scenario, health_tests
from slogen.promtests.injector_tests import injector_scenarios
from slogen.rules.health import HealthAlert, HealthOptions

MODEL = "NVIDIA H100 80GB HBM3"
HBM = "85520809984"  # an H100's llm_gpu_memory_total_bytes


def _gpu(host: str, index: int, pod: str = "", namespace: str = "", container: str = "") -> dict[str, str]:
    """A GPU series' labels as the exporter writes them (empty owner: idle, or the mapping is down)."""
    return {c.LABEL_GPU: str(index), c.LABEL_UUID: f"GPU-5f0e2b1c-0000-4000-8000-{host[-1:]}{index:011d}",
            c.LABEL_MODEL_NAME: MODEL, c.LABEL_PCI_BUS_ID: f"00000000:{16 + index:02x}:00.0", c.LABEL_HOSTNAME: host,
            c.LABEL_GPU_INSTANCE_ID: "", c.LABEL_GPU_INSTANCE_PROFILE: "", c.LABEL_POD: pod,
            c.LABEL_NAMESPACE: namespace, c.LABEL_CONTAINER: container, c.LABEL_CLUSTER: CLUSTER}


def _pool(host: str, pool: str) -> tuple[str, dict[str, str], str]:
    return (c.EXPORTER_NODE_POOL_INFO.name,
            {c.LABEL_HOSTNAME: host, c.LABEL_NODE_POOL: pool, c.LABEL_CLUSTER: CLUSTER}, "1x90")


def _holder(labels: dict[str, str], values: str) -> tuple[str, dict[str, str], str]:
    return c.GPU_MEMORY_TOTAL.name, labels, values


def _fired(host: str, pod: str, namespace: str) -> dict[str, str]:
    return {c.LABEL_CLUSTER: CLUSTER, c.LABEL_HOSTNAME: host, c.LABEL_NAMESPACE: namespace, c.LABEL_POD: pod}


def _names(opts: HealthOptions) -> tuple[str, str, str, str]:
    """A serving namespace and pod of the build's declaration, another pool's name, a namespace that serves nothing."""
    serving_ns = opts.serving_namespaces[0]
    serving_pod = f"{opts.serving_workloads[0]}-7d9f8-x2x4q" if opts.serving_workloads else "vllm-0"
    other_pool = next(p for p in ("training", "batch") if p != opts.isolation_pool)
    foreign_ns = next(n for n in ("train", "ml-train") if n not in opts.serving_namespaces)
    return serving_ns, serving_pod, other_pool, foreign_ns


def isolation_scenarios(opts: HealthOptions) -> dict[str, Scenario]:
    """The staged series and checks of each isolation alert, for this build's pool and serving pods."""
    if not opts.isolation_pool:
        return {}
    pool, foreign_for, off_for = opts.isolation_pool, opts.pool_foreign_pod_for // 60_000, opts.serving_off_pool_for // 60_000
    serving_ns, serving_pod, other_pool, foreign_ns = _names(opts)
    leave = 5 + foreign_for + 5  # the training pod's last sample; staleness markers follow
    trainer = ("llm-finetune-0", foreign_ns, "trainer")
    foreign = (
        _pool("gpu-node-a", pool), _pool("gpu-node-c", pool), _pool("gpu-node-b", other_pool),
        _holder(_gpu("gpu-node-a", 0, *trainer), f"_x5 {HBM}x{leave - 5} stale"),
        _holder(_gpu("gpu-node-a", 1, *trainer), f"_x5 {HBM}x{leave - 5} stale"),
        _holder(_gpu("gpu-node-a", 2, serving_pod, serving_ns, "vllm"), f"{HBM}x90"),
        _holder(_gpu("gpu-node-a", 3), f"{HBM}x90"),
        # node c: a notebook seen for two minutes, then the mapping is down: the GPU's labels are empty from 7m
        _holder(_gpu("gpu-node-c", 0, "notebook-0", foreign_ns, "jupyter"), f"_x5 {HBM}x1 stale"),
        _holder(_gpu("gpu-node-c", 0), f"_x7 {HBM}x80"),
        (c.EXPORTER_GPU_POD_MAPPING_UP.name, {c.LABEL_CLUSTER: CLUSTER, c.LABEL_POD: "llmslo-exporter-c"}, "1x6 0x80"),
        # node d: its exporter was told no pool, so nothing is claimed about it
        _holder(_gpu("gpu-node-d", 0, "llm-finetune-1", foreign_ns, "trainer"), f"{HBM}x90"),
    )
    off = (
        _pool("gpu-node-a", pool), _pool("gpu-node-b", other_pool),
        _holder(_gpu("gpu-node-b", 0, serving_pod, serving_ns, "vllm"), f"_x5 {HBM}x80"),
        _holder(_gpu("gpu-node-b", 1, *trainer), f"{HBM}x90"),
        _holder(_gpu("gpu-node-a", 0, serving_pod.replace("x2x4q", "k8p2w"), serving_ns, "vllm"), f"{HBM}x90"),
        _holder(_gpu("gpu-node-d", 0, serving_pod.replace("x2x4q", "m3n9t"), serving_ns, "vllm"), f"{HBM}x90"),
    )
    unwatched_for = opts.pool_unwatched_for // 60_000
    exporter = {c.LABEL_CLUSTER: CLUSTER, "job": "llmslo-exporter", "instance": "10.0.0.7:9400", "pod": "llmslo-exporter-7"}
    other = {**exporter, "instance": "10.0.0.8:9400", "pod": "llmslo-exporter-8"}
    unwatched = (
        # the pool node's exporter: its mapping down from 5m (the relay gone); the pool series from the same scrape
        (c.EXPORTER_NODE_POOL_INFO.name, {**exporter, c.LABEL_HOSTNAME: "gpu-node-a", c.LABEL_NODE_POOL: pool},
         f"1x{5 + unwatched_for + 30}"),
        (c.EXPORTER_GPU_POD_MAPPING_UP.name, exporter, f"1x4 0x{unwatched_for + 30}"),
        # another pool's exporter with its mapping down: not the inference pool's blind spot
        (c.EXPORTER_NODE_POOL_INFO.name, {**other, c.LABEL_HOSTNAME: "gpu-node-b", c.LABEL_NODE_POOL: other_pool},
         f"1x{5 + unwatched_for + 30}"),
        (c.EXPORTER_GPU_POD_MAPPING_UP.name, other, f"0x{5 + unwatched_for + 30}"),
    )
    return {
        H.POOL_UNWATCHED: Scenario(
            f"the mapping of a {pool} node's exporter down from 5m fires after {unwatched_for}m, with that exporter's "
            f"labels; another pool's exporter with its mapping down does not",
            unwatched, exporter, quiet=(4, 5 + unwatched_for - 1), firing=(5 + unwatched_for, 5 + unwatched_for + 20)),
        H.POOL_FOREIGN_POD: Scenario(
            f"a training pod on two GPUs of a {pool} node from 5m pages once after {foreign_for}m and clears when it "
            "leaves; a serving pod, an idle GPU, a pod whose mapping went down and a node told no pool do not",
            foreign, _fired("gpu-node-a", trainer[0], foreign_ns),
            quiet=(4, 5 + foreign_for - 1, leave + 1), firing=(5 + foreign_for, leave)),
        H.POOL_SERVING_OFF_POOL: Scenario(
            f"a serving pod on a {other_pool} node from 5m fires after {off_for}m; serving pods on the pool or on a node "
            "told no pool, and a training pod on its own pool, do not",
            off, _fired("gpu-node-b", serving_pod, serving_ns),
            quiet=(4, 5 + off_for - 1), firing=(5 + off_for,)),
    }


def health_and_isolation_tests(alerts: list[HealthAlert], opts: HealthOptions, rule_file: str) -> dict:
    """The health rule file's promtool tests, the isolation alerts' among them when the build declares the pool, the
    tap injector's when it installs the injector."""
    return health_tests(alerts, opts, rule_file, extra={**isolation_scenarios(opts), **injector_scenarios(opts)})
