"""The inference pool's isolation, as the install declares it (`isolation:` in llmslo.yaml).

Why declared: "train gangs and inference SLOs don't share a pool" is a rule about names only the install knows:
which node pool serves (the value of a node label on its nodes; the exporters there are told it, as
`--node-pool`, and say it as llm_exporter_node_pool_info) and which pods are serving pods (their namespaces,
by default the install's inferenceNamespaces, optionally narrowed to the serving workloads: their pods are named
`<workload>-...`, as a Deployment's, a StatefulSet's and a LeaderWorkerSet's are).
The health rules (slogen/rules/isolation.py) alert on a GPU of the pool held by anything else, and on a serving
pod's GPU on a node of another pool.

    isolation:
      pool: inference                   # the pool label's value on the inference pool's nodes
      nodeLabel: llmslo.io/node-pool    # the node label that names a node's pool (this default when left out)
      servingNamespaces: [llm]          # the serving pods' namespaces (default: inferenceNamespaces)
      servingWorkloads: [vllm-llama-3-8b] # the serving workloads' names: pods named <name>-... (default: any pod)
      otherPools: [training]            # other pools whose exporters say their name (a serving pod there is seen)

The install (slogen/overlay.py) runs one exporter DaemonSet per named pool, selecting `<nodeLabel>: <pool>` and
telling it the pool ($LLMSLO_NODE_POOL), and the shipped one on the other GPU nodes; a node of no named pool says none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slogen.errors import SpecError
from slogen.k8smeta import label_value_problem, namespace_problem, qualified_name_problem, subdomain_problem

KEY = "isolation"
DEFAULT_NODE_LABEL = "llmslo.io/node-pool"
MAX_WORKLOADS = 64  # each is one alternative of a regex matcher in two rules: a declaration, not a list of pods
MAX_OTHER_POOLS = 16  # each is an exporter DaemonSet
_FIELDS = {"pool": "pool", "nodeLabel": "node_label", "servingNamespaces": "serving_namespaces",
           "servingWorkloads": "serving_workloads", "otherPools": "other_pools"}


@dataclass(frozen=True)
class Isolation:
    """The inference pool and its serving pods. `serving_namespaces` empty: the install's inferenceNamespaces
    (`resolved`); `serving_workloads` empty: every pod in them serves."""

    pool: str
    node_label: str = DEFAULT_NODE_LABEL
    serving_namespaces: tuple[str, ...] = ()
    serving_workloads: tuple[str, ...] = ()
    other_pools: tuple[str, ...] = ()  # pools whose exporters are told their name too (the install's DaemonSets)

    @property
    def pools(self) -> tuple[str, ...]:
        """Every named pool: the inference pool first."""
        return (self.pool, *self.other_pools)

    def resolved(self, inference_namespaces: tuple[str, ...]) -> Isolation:
        return Isolation(self.pool, self.node_label, self.serving_namespaces or inference_namespaces,
                         self.serving_workloads, self.other_pools)


def _names(file: str, field: str, value: Any, errors: list[SpecError], example: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        errors.append(SpecError(file, "expected a list of names", field, fix=f"write {field}: [{example}]"))
        return ()
    return tuple(value)


def read(file: str, value: Any, inference_namespaces: tuple[str, ...], errors: list[SpecError]) -> Isolation | None:
    """The `isolation:` mapping of the settings file, resolved against its inferenceNamespaces; every problem is
    appended to `errors` (field `isolation.<key>`), and None comes back when there is one."""
    before = len(errors)
    if not isinstance(value, dict):
        errors.append(SpecError(file, "expected a mapping", KEY, fix=f"write {KEY}: {{pool: inference}}"))
        return None
    for key in value:
        if key not in _FIELDS:
            errors.append(SpecError(file, f"unknown key {key!r}", f"{KEY}.{key}", fix=f"use one of {', '.join(_FIELDS)}"))
    pool, label = value.get("pool"), value.get("nodeLabel", DEFAULT_NODE_LABEL)
    if not isinstance(pool, str) or not pool or (why := label_value_problem(pool)):
        why = "is missing or empty" if not isinstance(pool, str) or not pool else why
        errors.append(SpecError(file, f"the pool {pool!r} {why}", f"{KEY}.pool",
                                fix="write the value of the node label the inference pool's nodes carry, e.g. pool: inference"))
    if not isinstance(label, str) or (why := qualified_name_problem(label)):
        errors.append(SpecError(file, f"{label!r} is not a label key", f"{KEY}.nodeLabel",
                                fix=f"write a node label key, e.g. nodeLabel: {DEFAULT_NODE_LABEL}"))
    namespaces = _names(file, f"{KEY}.servingNamespaces", value.get("servingNamespaces", []), errors, "llm")
    errors += [SpecError(file, f"{n!r} {why}", f"{KEY}.servingNamespaces", fix="write namespace names")
               for n in namespaces if (why := namespace_problem(n))]
    if not (namespaces or inference_namespaces):
        errors.append(SpecError(file, "names no serving namespace, and inferenceNamespaces is empty", f"{KEY}.servingNamespaces",
                                fix="write servingNamespaces: [<your engines' namespace>], or set inferenceNamespaces"))
    workloads = _names(file, f"{KEY}.servingWorkloads", value.get("servingWorkloads", []), errors, "vllm-llama-3-8b")
    if len(workloads) > MAX_WORKLOADS:
        errors.append(SpecError(file, f"{len(workloads)} workloads, more than {MAX_WORKLOADS}", f"{KEY}.servingWorkloads",
                                fix="name the serving Deployments or StatefulSets, not their pods"))
    errors += [SpecError(file, f"{w[:80]!r} {why}", f"{KEY}.servingWorkloads",
                         fix="write a Deployment's or StatefulSet's name, e.g. vllm-llama-3-8b")
               for w in workloads if (why := subdomain_problem(w))]
    others = _names(file, f"{KEY}.otherPools", value.get("otherPools", []), errors, "training")
    if len(others) > MAX_OTHER_POOLS or len(set(others)) != len(others) or pool in others:
        errors.append(SpecError(file, f"{', '.join(others)}: at most {MAX_OTHER_POOLS} pools, each named once, "
                                      "the inference pool not among them", f"{KEY}.otherPools",
                                fix="name each other pool once, e.g. otherPools: [training, batch]"))
    errors += [SpecError(file, f"the pool {p!r} {why}", f"{KEY}.otherPools", fix="write a node label value, e.g. training")
               for p in others if (why := "is empty" if not p else label_value_problem(p))]
    if len(errors) > before:
        return None
    return Isolation(str(pool), str(label), namespaces, workloads, others).resolved(inference_namespaces)


def render(isolation: Isolation | None) -> str:
    """The `isolation:` block `slogen init` writes (commented out when there is none)."""
    if isolation is None:
        return (f"# The inference pool kept apart (docs/exporter.md, \"Node pools\"): alert when a GPU of the pool's nodes is\n"
                f"# held by a pod outside the serving namespaces, or a serving pod's GPU is on another pool's node.\n"
                f"# {KEY}: {{pool: inference, nodeLabel: {DEFAULT_NODE_LABEL}}}\n")
    workloads = ", ".join(isolation.serving_workloads)
    return (f"# The inference pool kept apart (docs/exporter.md, \"Node pools\").\n{KEY}:\n  pool: {isolation.pool}\n"
            f"  nodeLabel: {isolation.node_label}\n  servingNamespaces: [{', '.join(isolation.serving_namespaces)}]\n"
            f"  servingWorkloads: [{workloads}]\n  otherPools: [{', '.join(isolation.other_pools)}]\n")
