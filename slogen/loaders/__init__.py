"""Read SLO inputs: files or directories of YAML, any mix of formats, multi-document.

Each document is sniffed (Sloth `prometheus/v1`, Sloth `PrometheusServiceLevel`, OpenSLO
`v1alpha` and `v1`, Pyrra `ServiceLevelObjective`, Sloth `AlertWindows` catalogs) and mapped into the one SLO model. Every
problem is collected as a SpecError naming the file, line, SLO and field; the load fails
with all of them at once. Duplicate SLO ids across the whole load are errors too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from llmslo.sli_plugins import GoodputParams, same_class
from llmslo.specfile import SpecFileError, discover, read_documents
from llmslo.suggest import closest
from slogen.autoscaling import DEFAULT_DIR as AUTOSCALING_DIR
from slogen.autoscaling import VERSION as AUTOSCALING_VERSION
from slogen.errors import SpecError, SpecErrors
from slogen.loaders import k8s, openslo, pyrra, sloth, windows
from slogen.loaders.common import Reporter
from slogen.model import SLO, AlertWindows


@dataclass
class Loaded:
    slos: list[SLO] = field(default_factory=list)
    windows: list[AlertWindows] = field(default_factory=list)
    warnings: list[SpecError] = field(default_factory=list)
    errors: list[SpecError] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def load_paths(paths: list[str | Path], *, allow_duplicates: bool = False, windows_only: bool = False,
               raise_errors: bool = True) -> Loaded:
    result = Loaded()
    docs: list[tuple[Reporter, int, object]] = []
    for path in paths:
        files = discover(path)
        if not files:
            result.errors.append(SpecError(str(path), "no YAML files found", fix="point at a .yaml file or a directory of them"))
        for file in files:
            r = Reporter(str(file))
            result.files.append(str(file))
            try:
                items = read_documents(file)
            except OSError as e:
                r.error(f"cannot read: {e.strerror or e}", fix="check the path")
                result.errors += r.errors
                continue
            except SpecFileError as e:  # not UTF-8, not YAML, a duplicate key, nesting too deep
                r.error(e.message, line=e.line, fix=e.fix)
                result.errors += r.errors
                continue
            for i, doc in enumerate(items):
                for item in (doc if isinstance(doc, list) else [doc]):  # OpenSLO also allows a list of objects
                    docs.append((r, i, item))
    reporters: dict[str, Reporter] = {}
    refs = openslo.V1Refs.collect([d for _, _, d in docs])
    for r, i, doc in docs:
        reporters[r.file] = r
        if windows.is_spec(doc):
            w = windows.load(doc, r)
            if w is not None:
                result.windows.append(w)
            continue
        if windows_only:
            continue
        result.slos += _load_doc(doc, r, i, refs)
    for r in reporters.values():
        result.errors += r.errors
        result.warnings += r.warnings
    result.slos = own_windows(result.slos, result.windows)
    if not windows_only and not allow_duplicates:
        result.errors += duplicate_errors(result.slos)
    if not windows_only:
        result.errors += goodput_class_errors(result.slos)
    if raise_errors and result.errors:
        raise SpecErrors(result.errors)
    return result


def load_catalog_path(path: str | Path) -> list[AlertWindows]:
    """Every AlertWindows document in a file or (recursively) a directory; SpecErrors on problems."""
    return load_paths([path], windows_only=True).windows


def own_windows(slos: list[SLO], catalogs: list[AlertWindows]) -> list[SLO]:
    """Each SLO with its file's own catalog for its period: what it uses wherever it loads (build, validate,
    generate), whatever other catalogs are loaded for that period (a Pyrra file `slogen convert` wrote keeps
    Pyrra's windows beside a 28d SLO on the built-in ones)."""
    by_file: dict[tuple[str, int | None], AlertWindows] = {(w.source, w.period): w for w in catalogs}
    return [replace(slo, windows=by_file[slo.origin.file, slo.period])
            if slo.windows is None and (slo.origin.file, slo.period) in by_file else slo for slo in slos]


def _load_doc(doc: object, r: Reporter, i: int, refs: openslo.V1Refs) -> list[SLO]:
    if not isinstance(doc, dict):
        r.error(f"document {i + 1} is not a mapping", fix="each YAML document must be one spec object")
        return []
    version = doc.get("version")
    if version is not None and "apiVersion" not in doc:
        if version == sloth.PROMETHEUS_V1.spec:
            return sloth.load(doc, r, i)
        line = doc.line_of("version") if hasattr(doc, "line_of") else None
        if version == AUTOSCALING_VERSION:
            r.error(f"this is an autoscaling spec (version {AUTOSCALING_VERSION}), not an SLO spec", "version",
                    line=line, fix=f"move it to {AUTOSCALING_DIR}/ or pass --autoscaling DIR naming its directory "
                                   "(and leave it out of the SLO inputs)")
            return []
        near = closest(str(version), (sloth.PROMETHEUS_V1.spec, AUTOSCALING_VERSION))
        r.error(f"unsupported spec version {version!r}", "version", line=line,
                fix=f'write version: "{near or sloth.PROMETHEUS_V1.spec}"')
        return []
    if k8s.is_spec(doc):
        return k8s.load(doc, r, i)
    if pyrra.is_spec(doc):
        return pyrra.load(doc, r, i)
    if openslo.is_v1alpha(doc):
        return openslo.load_v1alpha(doc, r, i)
    if openslo.is_v1(doc):
        return openslo.load_v1(doc, r, i, refs)
    r.error(f"document {i + 1} is not a spec slogen reads (apiVersion={doc.get('apiVersion')!r}, kind={doc.get('kind')!r})",
            fix='use version: "prometheus/v1", a sloth.slok.dev/v1 PrometheusServiceLevel or AlertWindows, '
                "an OpenSLO openslo/v1alpha or openslo/v1 SLO, or a Pyrra pyrra.dev/v1alpha1 ServiceLevelObjective")
    return []


def goodput_class_errors(slos: list[SLO]) -> list[SpecError]:
    """A goodput class named by several SLOs must have one definition (ttft, tpot, models), as the tap refuses
    otherwise (llmslo.sli_plugins.same_class): it holds each request of a class to one objective."""
    first: dict[str, SLO] = {}
    errors = []
    for slo in slos:
        params = getattr(slo.sli, "params", None)
        if not isinstance(params, GoodputParams):
            continue
        seen = first.setdefault(params.slo_class, slo)
        if seen is slo or same_class(seen.sli.params, params):  # type: ignore[union-attr, arg-type]
            continue
        errors.append(SpecError(
            slo.origin.file, f"slo_class {params.slo_class!r} is also defined by SLO {seen.id!r} in {seen.origin.file}"
            + (f":{seen.origin.line}" if seen.origin.line else "") + " with other thresholds or models",
            field=f"{slo.origin.path}.sli.plugin.options" if slo.origin.path else "sli.plugin.options", slo=slo.id,
            fix="give each class one definition: the same ttft, tpot and models in every goodput SLO of the class",
            line=slo.origin.line,
        ))
    return errors


def duplicate_errors(slos: list[SLO]) -> list[SpecError]:
    """SLO ids (`<service>-<name>`) must be unique across everything loaded together."""
    seen: dict[str, SLO] = {}
    errors = []
    for slo in slos:
        first = seen.get(slo.id)
        if first is None:
            seen[slo.id] = slo
            continue
        errors.append(SpecError(
            slo.origin.file, f"SLO id {slo.id!r} is already defined in {first.origin.file}"
            + (f":{first.origin.line}" if first.origin.line else ""),
            field=f"{slo.origin.path}.name" if slo.origin.path else "name", slo=slo.id,
            fix="rename one of the SLOs (or its service): the id <service>-<name> names its series and alerts",
            line=slo.origin.line,
        ))
    return errors
