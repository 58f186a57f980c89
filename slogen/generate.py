"""`slogen generate`: Sloth's `generate` command, one output document per input document.

Plain specs (prometheus/v1, OpenSLO) become Prometheus rule files, Sloth CRDs become
PrometheusRule objects named after the CRD, as Sloth does. With `sloth_compat` (the CLI's default,
so that it is a drop-in) the rules are Sloth's own; without it (`--llm-extras`) they are slogen's
(traffic-weighted SLIs, per-tier alerts).
"""

from __future__ import annotations

from itertools import groupby

from slogen.loaders import load_paths
from slogen.loaders.k8s import API_VERSION as K8S_SPEC
from slogen.model import SLO
from slogen.rules import generate
from slogen.rules.options import GenOptions
from slogen.writers import SLOTH_K8S_LABELS, header, prometheus_rule, rule_file


def generate_file(path: str, opts: GenOptions) -> str:
    """The generated YAML stream for one input file (one document per input document)."""
    loaded = load_paths([path], allow_duplicates=True)
    return render_documents(loaded.slos, opts)


def render_documents(slos: list[SLO], opts: GenOptions) -> str:
    results = generate(slos, opts)
    out = []
    mode = "Sloth-compatible" if opts.sloth_compat else "traffic-weighted"
    head = f"---\n{header(version=opts.version).rstrip()}\n# Mode: {mode}.\n"
    for (_, _), grouped in groupby(results, key=lambda r: (r.slo.origin.file, r.slo.origin.doc)):
        items = list(grouped)
        groups = [g for r in items for g in r.rules.groups()]
        if not groups:
            continue
        origin = items[0].slo.origin
        if origin.spec == K8S_SPEC:
            out.append(prometheus_rule(origin.k8s_name, groups, namespace=origin.k8s_namespace,
                                       labels=origin.k8s_labels, annotations=origin.k8s_annotations, head=head,
                                       managed_labels=SLOTH_K8S_LABELS if opts.sloth_compat else None))
        else:
            out.append(rule_file(groups, head))
    return "".join(out)
