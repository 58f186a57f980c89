"""The install's settings and the generated objects' Kubernetes metadata on the command line: the flags of
`slogen build`, `init` and `overlay`, merged over the settings file (slogen/settings.py; a flag must agree with
the file), and checked as the API server would check them (slogen/k8smeta.py: KubeOptions.problems)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from slogen import settings as st
from slogen.errors import SpecError, UsageError
from slogen.k8smeta import (
    DEFAULT_ALERTMANAGER_CONFIG,
    DEFAULT_DASHBOARD_FOLDER,
    DEFAULT_DASHBOARD_LABELS,
    DEFAULT_FOLDER_ANNOTATION,
    DEFAULT_PROVIDER_PATH,
    KubeOptions,
    ObjectMeta,
)
from slogen.settings import InstallSettings


def pairs(flag: str, values: list[str]) -> dict[str, str]:
    """KEY=VALUE flags as a dict, a key given two values refused naming both (settings.pairs; Kubernetes'
    own checks come after, in KubeOptions.problems)."""
    try:
        return st.pairs(flag, values or [])
    except SpecError as e:
        raise UsageError(f"{e.file} {e.message} ({e.fix})") from None


def kube_options(args: argparse.Namespace, install: InstallSettings | None) -> KubeOptions:
    """The Kubernetes settings of `slogen build` (labels, namespace and receivers from the install's settings,
    which already hold the flags); a UsageError naming the flag for what the API server would refuse."""
    labels = dict(install.object_labels) if install else pairs("--object-label", args.object_label)
    opts = KubeOptions(
        meta=ObjectMeta(labels, pairs("--object-annotation", args.object_annotation)),
        # the namespace when a settings file or --namespace gives it: labels alone move no object
        namespace=install.namespace if install and (install.path or args.namespace) else "",
        receivers=dict(install.receivers) if install else {},
        dashboard_labels=pairs("--dashboard-label", args.dashboard_label) if args.dashboard_label
        else dict(DEFAULT_DASHBOARD_LABELS),
        folder_annotation=args.dashboard_folder_annotation, folder=args.dashboard_folder,
        provider_path=args.grafana_dashboards_path, alertmanager_config_name=args.alertmanager_config_name)
    problems = opts.problems()
    if problems:
        raise UsageError("; ".join(f"{flag} {why}" for flag, why in problems))
    return opts


# ------------------------------------------------------------------------------ install settings


def install_args(p: argparse.ArgumentParser, *, labels: bool = True) -> None:
    """The install's settings as flags (slogen.settings; each may also be in llmslo.yaml, and must agree)."""
    i = p.add_argument_group("install settings", f"written once in {st.DEFAULT_NAME} (slogen init); a flag "
                             "given here must agree with the file (docs/deploy.md)")
    i.add_argument("--settings", default=None, metavar="FILE",
                   help=f"the install's settings (default: {st.DEFAULT_NAME} beside the SLO directory, when it exists)")
    i.add_argument("--namespace", default=None, metavar="NS",
                   help=f"the exporter, PrometheusRules, dashboard ConfigMaps and AlertmanagerConfig "
                        f"(default {st.DEFAULT_NAMESPACE} with settings; none without)")
    i.add_argument("--inference-namespace", action="append", default=[], metavar="NS",
                   help="a namespace your engines, taps and ScaledObjects run in (repeatable; default: none, no deploy/install)")
    if labels:
        i.add_argument("--object-label", action="append", default=[], metavar="KEY=VALUE",
                       help="label on every object of the install (repeatable), e.g. release=kps (default: none)")
    i.add_argument("--floor", choices=st.FLOORS, default=None,
                   help="the serving security floor: off (default), audit (warn and audit), enforce")
    i.add_argument("--image", default=None, metavar="REF@sha256:DIGEST",
                   help="the exporter's image by digest (e.g. the one `make release` wrote; default: none)")
    i.add_argument("--api-server-cidr", default=None, metavar="CIDR",
                   help=f"the API server's endpoints, the exporter's egress (default {st.DEFAULT_API_SERVER_CIDR})")
    i.add_argument("--receiver", action="append", default=[], metavar="NAME=URL",
                   help="an Alertmanager receiver's webhook URL (repeatable): llmslo-page, llmslo-ticket, a team (default: none)")


def install_settings(args: argparse.Namespace, inputs: Sequence[str], read_file: bool = True) -> InstallSettings | None:
    """The settings file with the flags on top (conflicts refused, naming both values); None when there is
    neither a file nor an install flag (a plain build, as before settings existed)."""
    path = st.path_for(inputs, args.settings) if read_file else None
    labels, receivers = pairs("--object-label", args.object_label), pairs("--receiver", args.receiver)
    flags = {"namespace": args.namespace, "inference_namespaces": tuple(args.inference_namespace),
             "object_labels": labels, "floor": args.floor,
             "image": args.image, "api_server_cidr": args.api_server_cidr,
             "receivers": receivers}
    if path is None and not any(flags.values()):
        return None
    base = st.load(path) if path is not None else st.InstallSettings()
    if path is not None:
        print(f"note: install settings read from {path}", file=sys.stderr)
    try:
        merged = st.merge(base, flags)
    except SpecError as e:  # a flag against the file: a usage error, naming both values
        raise UsageError(f"{e.file} {e.message} ({e.fix})") from None
    problems = st.problems(merged)
    if problems:
        raise UsageError("; ".join(f"{flag} {why}" for flag, why in problems))
    return merged




def kubernetes_args(b: argparse.ArgumentParser) -> None:
    k = b.add_argument_group("Kubernetes objects", "labels and annotations of every generated object, and how "
                             "Grafana and Alertmanager find theirs (docs/deploy.md, kube-prometheus-stack)")
    k.add_argument("--object-label", action="append", default=[], metavar="KEY=VALUE",
                   help="label on every generated Kubernetes object (repeatable), e.g. release=kube-prometheus-stack "
                        "for the chart's ruleSelector (unlike -l, which labels the rules inside; default: none)")
    k.add_argument("--object-annotation", action="append", default=[], metavar="KEY=VALUE",
                   help="annotation on every generated Kubernetes object (repeatable; default: none)")
    k.add_argument("--dashboard-label", action="append", default=[], metavar="KEY=VALUE",
                   help="label the Grafana sidecar selects the dashboard ConfigMaps by (repeatable; default "
                        + ", ".join(f"{k}={v}" for k, v in DEFAULT_DASHBOARD_LABELS.items()) + ")")
    k.add_argument("--dashboard-folder-annotation", default=DEFAULT_FOLDER_ANNOTATION, metavar="KEY",
                   help=f"annotation naming the Grafana folder on the dashboard ConfigMaps (the sidecar's "
                        f"folderAnnotation; default {DEFAULT_FOLDER_ANNOTATION})")
    k.add_argument("--dashboard-folder", default=DEFAULT_DASHBOARD_FOLDER, metavar="NAME",
                   help=f"Grafana folder of the dashboards (default {DEFAULT_DASHBOARD_FOLDER!r})")
    k.add_argument("--grafana-dashboards-path", default=DEFAULT_PROVIDER_PATH, metavar="DIR",
                   help=f"where dashboards/grafana-provider.yaml tells Grafana the JSON files are (default {DEFAULT_PROVIDER_PATH})")
    k.add_argument("--alertmanager-config-name", default=DEFAULT_ALERTMANAGER_CONFIG, metavar="NAME",
                   help=f"name of the generated AlertmanagerConfig (default {DEFAULT_ALERTMANAGER_CONFIG})")
