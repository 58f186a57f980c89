"""The `slogen` command: build, validate, generate (a drop-in for `sloth generate`), version.

CI should run `slogen validate --strict` (or `slogen build --strict --check`): every warning, such as an
unknown key Sloth would ignore, is then an error."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmslo.argtypes import number_arg
from llmslo.durations import DAY, format_prometheus_duration
from llmslo.files import write_atomic
from llmslo.specfile import discover
from slogen import VERSION_LABEL, __version__, promtoolcheck, thresholdargs
from slogen.errors import SpecError, SpecErrors, UsageError
from slogen.generate import render_documents
from slogen.installargs import install_args, install_settings, kube_options, kubernetes_args
from slogen.k8smeta import label_value_problem
from slogen.links import DEFAULT_GRAFANA_URL, GRAFANA_URL_ENV
from slogen.loaders import load_paths
from slogen.loaders.common import LABEL_NAME_RE, RESERVED_LABELS
from slogen.loaders.windows import BUILTIN, merge
from slogen.rules import generate
from slogen.rules.alerts import RUNBOOK_PLACEHOLDERS, is_runbook_template
from slogen.rules.options import (
    DEFAULT_PAGE_MIN_BAD_EVENTS,
    DEFAULT_RUNBOOK_BASE_URL,
    UNREACHABLE_FAIL,
    UNREACHABLE_RESCALE,
    GenOptions,
)
from slogen.rules.tiers import unreachable_warnings
from slogen.thresholdargs import duration as _duration
from slogen.thresholdargs import threshold_flags, threshold_options, thresholds_arg, thresholds_problems

_count = number_arg(int, lambda n: n >= 0, "a whole number >= 0")


def _labels(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not LABEL_NAME_RE.match(key) or not value:
            raise UsageError(f"--extra-labels {pair!r}: write key=value with a valid label name and a value")
        if key in RESERVED_LABELS:
            raise UsageError(f"--extra-labels {pair!r}: {key} is reserved by slogen; choose another name")
        out[key] = value
    return out


def _runbook(args: argparse.Namespace) -> str:
    """The runbook link option: `--runbook-url` (a template naming {{alert}} or {{service}}) or the base URL."""
    if not args.runbook_url:
        return args.runbook_base_url
    names = ", ".join("{{" + n + "}}" for n in RUNBOOK_PLACEHOLDERS)
    if not is_runbook_template(args.runbook_url):
        raise UsageError(f"--runbook-url {args.runbook_url!r} names none of {names}: every alert would link one page; "
                         "write e.g. --runbook-url 'https://wiki.example/runbooks/{{alert}}' (or use --runbook-base-url)")
    rest = re.sub(r"{{\s*(alert|service)\s*}}", "", args.runbook_url)
    if not re.match(r"^(https?|file)://", args.runbook_url) or re.search(r"{{|}}", rest):
        raise UsageError(f"--runbook-url {args.runbook_url!r}: write an http(s) or file URL whose only placeholders "
                         f"are {names}")
    return args.runbook_url


def _gen_args(p: argparse.ArgumentParser, *, sloth_generate: bool = False) -> None:
    p.add_argument("--default-slo-period", type=_duration, default=30 * DAY, metavar="PERIOD",
                   help="period of SLOs that set none (default 30d)")
    p.add_argument("-l", "--extra-labels", action="append", default=[], metavar="KEY=VALUE",
                   help="label added to every generated rule (repeatable; default: none)")
    if sloth_generate:  # a drop-in for `sloth generate`: Sloth's rules unless asked for more
        p.add_argument("--llm-extras", dest="sloth_compat", action="store_false", default=True,
                       help="emit slogen's rules instead of Sloth's: traffic-weighted SLIs, per-tier page/ticket "
                            "alerts, the low-traffic guard and the no-data alert (default: off, Sloth's 2 alerts "
                            "per SLO, as `sloth generate`)")
        p.add_argument("--sloth-compat", dest="sloth_compat_alias", action="store_true",
                       help="accepted for scripts written before generate made Sloth's rules by default: a no-op "
                            "(default: Sloth's rules already)")
    else:
        p.add_argument("--sloth-compat", action="store_true", default=False,
                       help="emit exactly Sloth v0.16's rules (no traffic-weighted SLI, per-tier alerts, tests)")
    p.add_argument("--unreachable-tiers", choices=(UNREACHABLE_FAIL, UNREACHABLE_RESCALE), default=UNREACHABLE_FAIL,
                   help="an alert tier that can never fire: fail (default) or rescale it to fire at a 90%% error ratio")
    p.add_argument("--derive-above", type=_duration, default=None, metavar="WINDOW",
                   help="windows longer than this derive from the base-window rates (default: the longest page window)")
    p.add_argument("--page-min-bad-events", type=_count, default=DEFAULT_PAGE_MIN_BAD_EVENTS, metavar="N",
                   help="low-traffic guard: a page tier pages only with at least N bad events in its long window, "
                        f"else it tickets (default {DEFAULT_PAGE_MIN_BAD_EVENTS}; 0: off; an SLO's "
                        "page_min_bad_events wins)")


def _gen_options(args: argparse.Namespace, windows: dict | None = None) -> GenOptions:
    return GenOptions(
        sloth_compat=args.sloth_compat, default_period=args.default_slo_period,
        windows=windows if windows is not None else dict(BUILTIN), extra_labels=_labels(args.extra_labels),
        unreachable_tiers=args.unreachable_tiers, derive_above=args.derive_above,
        page_min_bad_events=args.page_min_bad_events,
        disable_alerts=getattr(args, "disable_alerts", False), disable_recordings=getattr(args, "disable_recordings", False),
        runbook_base_url=getattr(args, "runbook_base_url", DEFAULT_RUNBOOK_BASE_URL),
        grafana_url=getattr(args, "grafana_url", DEFAULT_GRAFANA_URL),
        period_override=getattr(args, "override_period", None),
    )


def _strict_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="every warning is an error (an unknown key, a misspelt `disable`): what CI should run")


def _autoscaling_args(p: argparse.ArgumentParser) -> None:
    from slogen.pools import DEFAULT_HELP

    p.add_argument("--autoscaling", dest="autoscaling_dir", default=None, metavar="DIR",
                   help=f"directory of autoscaling specs (llmslo/autoscaling/v1) to validate and make KEDA and HPA "
                        f"objects from (default: {DEFAULT_HELP})")
    p.add_argument("--no-autoscaling", dest="autoscaling", action="store_false",
                   help="read no autoscaling specs and make no KEDA objects (e.g. for a compressed demo catalog)")


def _autoscaling_note(args: argparse.Namespace) -> Path:
    """The autoscaling directory this run reads, said on stderr (or that there is none)."""
    from slogen import pools

    path = pools.directory(args.paths or ["slos"], args.autoscaling_dir)
    print(f"note: {pools.note(path, bool(args.autoscaling_dir))}", file=sys.stderr)
    return path


def _strict_failed(args: argparse.Namespace, warnings: list[SpecError], what: str) -> bool:
    """With --strict, report the warnings as errors and say the run failed."""
    if not getattr(args, "strict", False) or not warnings:
        return False
    _report(list(warnings))
    print(f"{what} failed: --strict makes {len(warnings)} warning(s) errors; nothing was written", file=sys.stderr)
    return True


def _report(errors: Sequence[SpecError], warnings: Sequence[SpecError] = ()) -> None:
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)


def _windows(paths: list[str], replace: bool = False) -> dict:
    catalogs = load_paths(paths, windows_only=True).windows if paths else []
    if paths and not catalogs:
        raise UsageError(f"no AlertWindows catalogs found in {', '.join(paths)}")
    return merge(catalogs, {} if replace else None)


# ---------------------------------------------------------------------------------- build


def cmd_build(args: argparse.Namespace) -> int:
    # The artifact generators (dashboards, runbooks: grafanalib, jinja2) load only for `build`: `generate`
    # and `validate` start 0.1 s sooner without them.
    from slogen.build import BuildOptions, build_into
    from slogen.outtree import scratch_dir

    install = install_settings(args, args.paths or ["slos"])
    if install is not None and install.inference_namespaces and not install.image:
        raise UsageError(f"--image: {install.path or 'the settings'} name the inference namespaces, so the build writes "
                         "deploy/install, which must name the exporter's image by digest: set image: "
                         "REGISTRY/NAME@sha256:<64 hex> (the digest `make release` writes to dist/)")
    if install is not None:  # the settings' links, unless a flag gave one
        args.runbook_url = args.runbook_url or install.runbook_url
        if install.grafana_url and args.grafana_url == DEFAULT_GRAFANA_URL:
            args.grafana_url = install.grafana_url
    args.runbook_base_url = _runbook(args)
    kube = kube_options(args, install)
    gen = _gen_options(args, _windows(args.windows))
    health, capacity = threshold_options(args)
    options = BuildOptions(inputs=tuple(args.paths or ["slos"]), gen=gen, health=health, capacity=capacity,
                           autoscaling=args.autoscaling, autoscaling_dir=args.autoscaling_dir, kube=kube,
                           install=install)
    if args.autoscaling:
        _autoscaling_note(args)
    # every file is written to a scratch directory as it is made (a build's memory is its catalog, not its
    # text); for --check beside the system's temporary files, else under --out, where staging links it in
    # promtool checks each step's rule files as soon as the step has made them (while the build makes the rest)
    with (tempfile.TemporaryDirectory(prefix="slogen-check-") if args.check else scratch_dir(Path(args.out))) as scratch, \
            promtoolcheck.RuleFilesCheck() as check:
        return _build_from(args, build_into(options, Path(scratch), on_step=check.add if args.promtool_check else None),
                           check)


def _build_from(args: argparse.Namespace, built, check: promtoolcheck.RuleFilesCheck) -> int:
    """The rest of `slogen build`, once every file is made: notes, promtool, then --check or the write."""
    from slogen.outputs import stale_outputs, write_outputs

    catalog, artifacts = built.catalog, built.files
    if _strict_failed(args, catalog.warnings, "build"):
        return 1
    _report([], catalog.warnings)
    for note in built.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.promtool_check:
        rejected = check.rejected()
        if rejected:
            for path, message in rejected:
                print(f"error: {path}: promtool check rules rejects the generated file: {message}", file=sys.stderr)
            print(f"build failed: promtool rejects {len(rejected)} generated rule file(s); nothing was written "
                  f"(fix the spec or option text named above, or report a slogen bug)", file=sys.stderr)
            return 1
    if args.check:
        stale = stale_outputs(artifacts, args.out)
        for s in stale:
            print(f"stale: {s}", file=sys.stderr)
        if stale:
            print("generated outputs are stale: run `slogen build` and commit the result", file=sys.stderr)
            return 1
        print(f"{len(artifacts)} generated files are up to date", file=sys.stderr)
        return 0
    try:
        changed, removed = write_outputs(artifacts, args.out)
    except OSError as e:
        print(f"error: cannot write the outputs under {args.out}: {e} (nothing was replaced: the previous outputs are "
              "as they were; fix: free space or fix permissions there and run `slogen build` again)", file=sys.stderr)
        return 1
    print(f"slogen: {len(catalog.slos)} SLOs, {len(artifacts)} files ({len(changed)} changed, {len(removed)} removed) "
          f"under {args.out}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    loaded = load_paths(args.paths, allow_duplicates=args.ignore_slo_duplicates, raise_errors=False)
    errors = list(loaded.errors)
    if not errors:
        extra = load_paths(args.windows, windows_only=True).windows if args.windows else []
        windows = merge(loaded.windows + extra)
        opts = _gen_options(args, windows)
        try:
            results = generate(loaded.slos, opts)
        except SpecErrors as e:
            errors += e.errors
            results = []
        loaded.warnings += unreachable_warnings(loaded.slos, opts)
        if results and args.promtool:
            errors += promtoolcheck.check_results(results)
        if args.autoscaling and not errors:
            errors += _validate_pools(args, results)
    elif args.autoscaling:  # the SLOs have errors: the pools' files still get read, not checked against them
        from slogen.autoscaling import read_paths

        path = _autoscaling_note(args)
        errors += read_paths([path])[1] if path.exists() else []
    errors += thresholds_problems(args)
    if args.strict:
        errors, warnings = list(loaded.warnings) + errors, []
    else:
        warnings = loaded.warnings
    _report(errors, warnings)
    if errors:
        print(f"validation failed: {len(errors)} problem(s) in {len(loaded.files)} file(s)", file=sys.stderr)
        return 1
    print(f"{len(loaded.slos)} SLOs in {len(loaded.files)} file(s) are valid", file=sys.stderr)
    return 0


def _validate_pools(args: argparse.Namespace, results) -> list[SpecError]:
    """What `slogen build` would refuse in the autoscaling specs (slogen.pools: the same reading)."""
    from slogen.pools import read_pools
    from slogen.views import from_context

    return read_pools(_autoscaling_note(args), [from_context(r.ctx) for r in results])[1]


# ------------------------------------------------------------------------------- generate


def cmd_generate(args: argparse.Namespace) -> int:
    if args.sloth_compat_alias and not args.sloth_compat:
        raise UsageError("--sloth-compat and --llm-extras contradict each other: --sloth-compat is generate's "
                         "default (Sloth's rules); drop one of them")
    windows = _windows([args.slo_period_windows_path], replace=True) if args.slo_period_windows_path else dict(BUILTIN)
    if args.default_slo_period not in windows:
        raise UsageError(f"--default-slo-period {format_prometheus_duration(args.default_slo_period)} has no alert-window catalog "
                         f"(have {', '.join(format_prometheus_duration(p) for p in sorted(windows))})")
    opts = _gen_options(args, windows)
    src = Path(args.input)
    if src.is_dir():
        out = Path(args.out)
        if args.out == "-" or not out.is_dir():
            raise UsageError("the input is a directory, so --out must be an existing directory")
        if out.resolve() == src.resolve():
            raise UsageError("input and output can't be the same directory")
        files = [f for f in discover(src) if _selected(f, args)]
        if not files:
            raise UsageError("0 SLO specs have been discovered")
        texts = [(f, _generate_one(f, opts, args.strict)) for f in files]
        for f, text in texts:
            write_atomic(out / f.relative_to(src), text)
        return 0
    text = _generate_one(src, opts, args.strict)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        write_atomic(args.out, text)
    return 0


def _selected(path: Path, args: argparse.Namespace) -> bool:
    p = path.as_posix()
    if args.fs_exclude and re.search(args.fs_exclude, p):
        return False
    return not args.fs_include or bool(re.search(args.fs_include, p))


def _generate_one(path: Path, opts: GenOptions, strict: bool = False) -> str:
    loaded = load_paths([path])
    if loaded.windows:  # the file's own catalogs, as build and validate read them
        opts = replace(opts, windows=merge(loaded.windows, dict(opts.windows)))
    loaded.warnings += unreachable_warnings(loaded.slos, opts)
    if strict and loaded.warnings:
        raise SpecErrors(loaded.warnings)
    _report([], loaded.warnings)
    if not loaded.slos:
        raise SpecErrors([SpecError(str(path), "no SLOs found", fix="add an SLO spec document")])
    return render_documents(loaded.slos, opts)


# ------------------------------------------------------------------------------- convert


def cmd_convert(args: argparse.Namespace) -> int:
    from slogen.convert import convert_paths

    if args.out != "-" and Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a directory: name the file to write, e.g. --out {args.out}/slos.yaml")
    text, warnings = convert_paths(args.inputs)
    if args.strict and warnings:
        raise SpecErrors(warnings)
    _report([], warnings)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        write_atomic(args.out, text)
    return 0


# ----------------------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="slogen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"slogen {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    _build_args(sub)
    _validate_args(sub)
    _generate_args(sub)
    _convert_args(sub)
    sub.add_parser("version", help="print the version (the sloth_version label value)")
    _schema_args(sub)
    thresholdargs.add_command(sub)
    _init_args(sub)
    _overlay_args(sub)
    _pod_security_args(sub)
    return ap


def _build_args(sub: Any) -> None:
    b = sub.add_parser("build", help="generate rules, tests and deploy objects from the SLO catalog")
    b.add_argument("paths", nargs="*", help="SLO spec files or directories (default: slos/)")
    b.add_argument("--out", default=".", help="output root; files go to alerts/, deploy/generated/, ... (default: .)")
    b.add_argument("--check", action="store_true", help="write nothing; exit 1 when the files under --out are stale")
    b.add_argument("--no-promtool-check", dest="promtool_check", action="store_false",
                   help="do not run `promtool check rules` on the generated rule files before writing them "
                        "(by default it runs when promtool is on PATH, and a rejected file fails the build)")
    b.add_argument("--runbook-base-url", default=os.environ.get("SLOGEN_RUNBOOK_BASE_URL", DEFAULT_RUNBOOK_BASE_URL),
                   help="runbook_url = BASE/docs/runbooks/<alertname>.md (env SLOGEN_RUNBOOK_BASE_URL; default "
                        f"{DEFAULT_RUNBOOK_BASE_URL})")
    b.add_argument("--runbook-url", default="", metavar="TEMPLATE",
                   help="runbook_url from a template instead, to fit an existing wiki: {{alert}} and {{service}} are "
                        "replaced, e.g. 'https://wiki/sre/llm/{{alert}}' (overrides --runbook-base-url; default: none)")
    b.add_argument("--grafana-url", default=os.environ.get(GRAFANA_URL_ENV, DEFAULT_GRAFANA_URL), metavar="URL",
                   help=f"the alerts' dashboard annotation = URL/d/<dashboard uid> (env {GRAFANA_URL_ENV}; default "
                        f"{DEFAULT_GRAFANA_URL}, a placeholder)")
    kubernetes_args(b)
    b.add_argument("--windows", action="append", default=[], metavar="PATH",
                   help="AlertWindows catalog file or directory for periods other than the built-in 30d and 28d "
                        "(repeatable; AlertWindows documents among the inputs load too; default: none)")
    b.add_argument("--override-period", type=_duration, default=None, metavar="PERIOD",
                   help="put every SLO on this period, e.g. 1d with --windows demo/windows.yaml for the demo "
                        "(default: each SLO's own)")
    _strict_arg(b)
    install_args(b, labels=False)
    _autoscaling_args(b)
    _gen_args(b)
    threshold_flags(b)


def _validate_args(sub: Any) -> None:
    v = sub.add_parser("validate", help="check SLO specs, their generation and the autoscaling specs without "
                                        "writing anything (everything `build` reads)")
    v.add_argument("paths", nargs="+", help="SLO spec files or directories (every *.yaml and *.yml below a directory)")
    v.add_argument("--ignore-slo-duplicates", action="store_true",
                   help="accept two SLOs with the same <service>-<name> id (as separate Sloth runs would)")
    v.add_argument("--windows", action="append", default=[], metavar="PATH",
                   help="AlertWindows catalog file or directory for periods other than the built-in 30d and 28d "
                        "(repeatable; default: none)")
    v.add_argument("--promtool", action="store_true", help="also parse every generated rule with promtool")
    thresholds_arg(v)
    _strict_arg(v)
    _autoscaling_args(v)
    _gen_args(v)


def _generate_args(sub: Any) -> None:
    g = sub.add_parser("generate", help="drop-in for `sloth generate`: one input file or directory to rules")
    g.add_argument("-i", "--input", required=True, metavar="PATH",
                   help="one SLO spec file, or a directory of them (then --out must be a directory)")
    g.add_argument("-o", "--out", default="-", metavar="PATH",
                   help="output file, or directory for a directory input (default: -, standard output)")
    g.add_argument("-e", "--fs-exclude", default="", metavar="REGEX",
                   help="with a directory input, skip files whose path matches (default: none skipped)")
    g.add_argument("-n", "--fs-include", default="", metavar="REGEX",
                   help="with a directory input, read only files whose path matches (default: all)")
    g.add_argument("--disable-alerts", action="store_true", help="generate no alert rules")
    g.add_argument("--disable-recordings", action="store_true", help="generate no recording rules")
    g.add_argument("--slo-period-windows-path", default="", metavar="DIR",
                   help="directory of AlertWindows catalogs (replaces the built-in 30d and 28d ones; default: none)")
    g.add_argument("--runbook-base-url", default=DEFAULT_RUNBOOK_BASE_URL, metavar="URL",
                   help=f"runbook_url = URL/docs/runbooks/<alertname>.md (default {DEFAULT_RUNBOOK_BASE_URL})")
    g.add_argument("--grafana-url", default=DEFAULT_GRAFANA_URL, metavar="URL",
                   help=f"the alerts' dashboard annotation = URL/d/<dashboard uid> (default {DEFAULT_GRAFANA_URL}, "
                        "a placeholder)")
    _strict_arg(g)
    _gen_args(g, sloth_generate=True)



def _convert_args(sub: Any) -> None:
    c = sub.add_parser("convert", help="convert Pyrra ServiceLevelObjective files to Sloth prometheus/v1 specs "
                                       "(with Pyrra's alert windows as AlertWindows catalogs)")
    c.add_argument("inputs", nargs="+", metavar="PATH", help="Pyrra files, or directories of them")
    c.add_argument("-o", "--out", default="-", metavar="FILE",
                   help="where to write the converted specs, replaced atomically (default: -, standard output)")
    _strict_arg(c)


# ----------------------------------------------------------------------------------- schema


def _schema_args(sub: Any) -> None:
    s = sub.add_parser("schema", help="write the JSON Schema of the files slogen reads (for editors' YAML "
                                      "language servers; docs/slogen.md)")
    s.add_argument("-o", "--out", default="-", metavar="PATH",
                   help="where to write it (default: -, standard output; the repository's copy is "
                        "schemas/slogen.schema.json)")
    s.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs from the schema")


def cmd_schema(args: argparse.Namespace) -> int:
    from slogen.schema import render

    text = render()
    if args.out == "-":
        if args.check:
            raise UsageError("--check needs --out PATH, the file to compare")
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            print(f"slogen: {out} is stale: run `slogen schema --out {out}`", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return 0


# ----------------------------------------------------------------------------- init, overlay


def _init_args(sub: Any) -> None:
    i = sub.add_parser("init", help="scaffold your own repository: example SLOs, thresholds, autoscaling, the "
                                    "install's settings (llmslo.yaml), a kustomization and a CI check")
    i.add_argument("dir", metavar="DIR", help="the repository to write into (made if missing)")
    i.add_argument("--service", default="chat", help="the service the example SLOs are for (default chat)")
    i.add_argument("--team", default="", help="the example SLOs' team label: its pages and tickets go to the "
                                              "receiver of that name (default: none)")
    i.add_argument("--force", action="store_true", help="overwrite files init wrote before")
    i.add_argument("--runbook-url", default="", metavar="TEMPLATE",
                   help="every alert's runbook link, with {{alert}} for its name (default: a placeholder the build warns of)")
    i.add_argument("--grafana-url", default="", metavar="URL",
                   help="your Grafana, for the alerts' dashboard links (default: a placeholder the build warns of)")
    install_args(i)


def cmd_init(args: argparse.Namespace) -> int:
    from slogen import scaffold

    root = Path(args.dir)
    if not args.inference_namespace:
        raise UsageError("--inference-namespace: name the namespace your engines run in (repeatable), e.g. "
                         "--inference-namespace llm")
    if not args.image:
        raise UsageError("--image: give the exporter's image by digest, REGISTRY/NAME@sha256:<64 hex> (the digest "
                         "`make release` writes to dist/, or the one your registry shows after you push it)")
    if args.settings:
        raise UsageError("--settings: init writes the settings file (DIR/llmslo.yaml); give the values as flags")
    if not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", args.service):
        raise UsageError(f"--service {args.service!r}: lowercase letters, digits and '-'")
    if args.team and (why := label_value_problem(args.team)):
        raise UsageError(f"--team {args.team!r}: {why}")
    install = install_settings(args, [], read_file=False)  # the flags are the new settings, whatever was there
    assert install is not None  # an inference namespace was given
    install = replace(install, runbook_url=args.runbook_url, grafana_url=args.grafana_url)
    files = scaffold.files(scaffold.Scaffold(install, args.service, args.team))
    existing = [rel for rel in files if (root / rel).exists()]
    if existing and not args.force:
        raise UsageError(f"{root} already has {', '.join(existing)}: nothing was written (--force overwrites them)")
    for rel, text in files.items():
        write_atomic(root / rel, text)
    print(f"slogen init: wrote {len(files)} files to {root}. Next:\n  cd {root} && slogen build && "
          "kubectl kustomize deploy", file=sys.stderr)
    return 0


def _overlay_args(sub: Any) -> None:
    o = sub.add_parser("overlay", help="write the install as a kustomize overlay over the shipped bases, from the "
                                       "install's settings (what `slogen build` writes to deploy/install)")
    o.add_argument("--generated", default="deploy/generated", metavar="DIR",
                   help="slogen build's deploy/generated (default deploy/generated)")
    o.add_argument("--out", default="deploy/install", metavar="DIR", help="the overlay to write (default deploy/install)")
    o.add_argument("--bases", default=None, metavar="DIR",
                   help="refer to these kustomize bases instead of copying the package's into OUT/bases")
    o.add_argument("paths", nargs="*", default=["slos"], help=argparse.SUPPRESS)
    install_args(o)


def cmd_overlay(args: argparse.Namespace) -> int:
    from slogen import overlay

    install = install_settings(args, args.paths)
    if install is None or not install.inference_namespaces:
        raise UsageError("--inference-namespace: name the namespaces your engines run in (or write llmslo.yaml)")
    out, generated = Path(args.out), Path(args.generated)
    if not (generated / "kustomization.yaml").is_file():
        raise UsageError(f"--generated {generated} has no kustomization.yaml: run `slogen build` first")
    try:
        overlay.check_generated(overlay.generated_objects(overlay.on_disk(generated)), install)
    except overlay.OverlayError as e:
        raise UsageError(str(e)) from None
    if not install.image:
        print("warning: no --image: the install names the placeholder digest, which no registry has; give the "
              "digest you pushed before you apply it", file=sys.stderr)
    bases = Path(args.bases) if args.bases else out / "bases"
    if args.bases and not (bases / "base" / "kustomization.yaml").is_file():
        raise UsageError(f"--bases {bases} has no base/kustomization.yaml")
    files = overlay.render(install, overlay.relative(generated, out), overlay.relative(bases, out))
    if not args.bases:
        files.update({f"bases/{rel}": text for rel, text in overlay.bases_files().items()})
    overlay.write(files, out)
    print(f"wrote {len(files)} files to {out}: kubectl kustomize {out}", file=sys.stderr)
    return 0


def _pod_security_args(sub: Any) -> None:
    p = sub.add_parser("pod-security", help="check every pod template of rendered manifests (e.g. `kubectl kustomize "
                                            "deploy | slogen pod-security -`) against its namespace's Pod Security "
                                            "levels, as the API server's admission will")
    p.add_argument("files", nargs="+", metavar="FILE", help="multi-document YAML files, `-` for standard input")
    p.add_argument("--assume", default="restricted", choices=["privileged", "baseline", "restricted"],
                   help="the level of a namespace the manifests do not hold (default restricted, the strictest)")
    p.add_argument("--strict", action="store_true", help="fail on warn and audit findings too, not only on enforce")


def cmd_pod_security(args: argparse.Namespace) -> int:
    """Exit 1 when the API server would refuse a pod (or, --strict, warn or audit one); each finding on stderr."""
    import yaml

    from slogen import podsecurity
    from slogen.yamlio import load_manifests

    docs: list = []
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
            docs += load_manifests(text)
        except (OSError, yaml.YAMLError) as e:
            raise UsageError(f"{name}: cannot read it as YAML: {e}") from None
    findings = podsecurity.check_manifests(docs, args.assume)
    for f in findings:
        print(f.line(), file=sys.stderr)
    failing = [f for f in findings if args.strict or f.mode == "enforce"]
    pods = sum(podsecurity.pod_template(d) is not None for d in docs if isinstance(d, dict))
    print(f"slogen pod-security: {pods} pod templates, {len(failing)} refused"
          + ("" if args.strict else f", {len(findings) - len(failing)} warned or audited"), file=sys.stderr)
    return 1 if failing else 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "version":
            print(VERSION_LABEL)
            return 0
        return {"build": cmd_build, "validate": cmd_validate, "generate": cmd_generate,
                "schema": cmd_schema, "thresholds": thresholdargs.cmd_thresholds, "convert": cmd_convert, "init": cmd_init,
                "overlay": cmd_overlay, "pod-security": cmd_pod_security}[args.command](args)
    except SpecErrors as e:
        _report(e.errors)
        return 1
    except SpecError as e:
        _report([e])
        return 1
    except UsageError as e:
        print(f"slogen: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["main"]
