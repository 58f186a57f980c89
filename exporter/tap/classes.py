"""Goodput classes and latency thresholds, read from the same SLO YAML that slogen compiles.

The tap needs two things from those files: the goodput classes (the `llmslo/goodput` SLI
plugin's options `slo_class`, `ttft`, `tpot`, `models`) and every latency threshold an SLI
reads from the tap's histograms (`llmslo/latency` with `source: tap`), because each one must
be a bucket edge for `bucket{le=threshold} / count` to be an exact SLI. Every `llmslo/*` SLI in
the files goes through the plugin contract's option reader (`llmslo.sli_plugins.read_options`) and
the files through slogen's YAML reader and discovery (`llmslo.specfile`), so the tap refuses exactly
the plugin options and hostile files `slogen validate` refuses; errors name the file, the SLO, the
field and the fix.

How a request maps to a class (first rule that applies):
1. header `x-slo-class` naming a configured class (only under --trusted-gateway-objectives: the proxy
   passes no header otherwise);
2. the first class (in file order) whose `models` globs match the request's `model`;
3. the class named `default`, if configured;
4. the first configured class; with no classes configured at all, an implicit `default`
   class without objectives.
Headers `x-slo-ttft-ms` / `x-slo-tpot-ms` (milliseconds) replace the class's objectives for that one request,
under the same trust: bounded, snapped down to a ladder and folded into a bounded set of derived classes
(exporter.tap.objectives), so a header can neither create unbounded label values nor break accounting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.tap.objectives import NOTHING, UNKNOWN_CLASS, Asked, DerivedClasses, Objective, read_asked
from exporter.tap.slofiles import MAX_NODES, SloSourceError, check_directory, count_nodes, read_sources
from llmslo import sli_plugins
from llmslo.confighash import config_hash
from llmslo.globs import matches
from llmslo.ranges import ALLOW_KEY
from llmslo.specfile import SpecFileError, decode, discover, load_documents

TAP_LATENCY_METRICS = sli_plugins.TAP_LATENCY_METRICS  # the tap's histograms a latency SLI may read

DEFAULT_CLASS = "default"
_MODEL_CACHE_LIMIT = 4096
# Only names no longer than this are cached: clients choose `model`, and 4,096 cached 1 MiB names
# would hold 4 GiB (the same bound as a model label value, exporter.tap.models).
_MODEL_CACHE_MAX_CHARS = 200


class SloConfigError(ValueError):
    """An SLO file the tap cannot use; the message names the file, the SLO, the field and the fix. `reason`: a
    short word for the log line (exporter.tap.slofiles' reasons, "empty", or "invalid")."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SloClass:
    """One goodput class: its objectives (seconds; None = not constrained) and model globs."""

    name: str
    ttft: float | None
    tpot: float | None
    models: tuple[str, ...] = ()
    origin: str = ""  # "FILE: SLO 'NAME'", for error messages

    def matches(self, model: str) -> bool:
        return matches(",".join(self.models), model)


@dataclass
class SloConfig:
    """The classes and the thresholds that must be histogram bucket edges, per tap metric."""

    classes: tuple[SloClass, ...]
    thresholds: dict[str, tuple[float, ...]]  # "ttft" | "tpot" | "e2e" -> sorted seconds
    hash: str = ""  # llmslo.confighash of the files read (conventions.TAP_CONFIG_INFO); "" for none
    _by_name: dict[str, SloClass] = field(init=False, repr=False)
    _fallback: SloClass = field(init=False, repr=False)
    _model_cache: dict[str, SloClass] = field(init=False, repr=False, default_factory=dict)
    # the header-derived classes handed out (exporter.tap.objectives); the proxy carries them over a reload
    derived: DerivedClasses = field(repr=False, default_factory=DerivedClasses)
    # the tightest TTFT and TPOT objectives of any class (admission sheds the sheddable to protect them)
    tightest: tuple[float | None, float | None] = field(init=False, repr=False, default=(None, None))

    def __post_init__(self) -> None:
        if not self.classes:
            self.classes = (SloClass(DEFAULT_CLASS, None, None, (), "implicit: no goodput SLI configured"),)
        self._by_name = {c.name: c for c in self.classes}
        self._fallback = self._by_name.get(DEFAULT_CLASS, self.classes[0])
        ttfts = [c.ttft for c in self.classes if c.ttft is not None]
        tpots = [c.tpot for c in self.classes if c.tpot is not None]
        self.tightest = (min(ttfts) if ttfts else None, min(tpots) if tpots else None)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def class_for_model(self, model: str) -> SloClass:
        cached = self._model_cache.get(model)
        if cached is not None:
            return cached
        found = next((c for c in self.classes if c.models and c.matches(model)), self._fallback)
        if len(self._model_cache) < _MODEL_CACHE_LIMIT and len(model) <= _MODEL_CACHE_MAX_CHARS:
            self._model_cache[model] = found
        return found

    def resolve(self, asked: Asked | Mapping[str, str], model: str) -> Objective:
        """The class and objectives for one request, from what its trusted x-slo-* headers ask (an Asked, or the
        fields by lowercased name) and its `model` field."""
        if not isinstance(asked, Asked):
            asked = read_asked(asked.items()) if asked else NOTHING
        if asked is NOTHING:
            by_model = self.class_for_model(model)
            return Objective(by_model.name, by_model.ttft, by_model.tpot)
        ignored = asked.ignored
        named = self._by_name.get(asked.slo_class) if asked.slo_class else None
        if named is None and asked.slo_class:
            ignored = (*ignored, UNKNOWN_CLASS)
        chosen = named if named is not None else self.class_for_model(model)
        if asked.ttft is None and asked.tpot is None:
            return Objective(chosen.name, chosen.ttft, chosen.tpot, ignored)
        return self.derived.fold(chosen.name, chosen.ttft, chosen.tpot, asked, ignored, self._by_name)


# ----------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------
def _slo_lists(doc: Any) -> list[Any] | None:
    """The `slos` list of a Sloth prometheus/v1 document or of a Sloth PrometheusServiceLevel CRD."""
    if not isinstance(doc, dict):
        return None
    if "slos" in doc:
        return doc["slos"]
    spec = doc.get("spec")
    if doc.get("kind") == "PrometheusServiceLevel" and isinstance(spec, dict):
        return spec.get("slos")
    return None  # another format (e.g. OpenSLO): it carries no llmslo plugin options


def _plugin(slo: dict[str, Any]) -> tuple[str, Any]:
    sli = slo.get("sli")
    plugin = sli.get("plugin") if isinstance(sli, dict) else None
    if not isinstance(plugin, dict):
        return "", None
    return str(plugin.get("id", "")), plugin.get("options")


def _params(plugin_id: str, options: Any, origin: str, allow_out_of_range: bool = False) -> sli_plugins.PluginParams:
    """The contract's reading of one llmslo/* SLI (the one `slogen validate` uses); its error, placed. A threshold
    outside its plausible range (llmslo.ranges: 500 s as a TTFT) is refused here too, unless the SLO allows it."""
    try:
        return sli_plugins.read_options(plugin_id, options, allow_out_of_range=allow_out_of_range)
    except sli_plugins.UnknownPluginError as e:
        raise SloConfigError(f"{origin}: sli.plugin.id: {e} (fix: {e.fix})") from None
    except sli_plugins.PluginOptionError as e:
        field = "sli.plugin.options" + (f".{e.option}" if e.option else "")
        raise SloConfigError(f"{origin}: {field}: {e}" + (f" (fix: {e.fix})" if e.fix else "")) from None


def _merge(classes: list[tuple[SloClass, sli_plugins.GoodputParams]], new: SloClass,
           params: sli_plugins.GoodputParams) -> None:
    for old, old_params in classes:
        if old.name != new.name:
            continue
        if not sli_plugins.same_class(old_params, params):
            raise SloConfigError(
                f"{new.origin}: slo_class {new.name!r} is also defined by {old.origin} with other thresholds or models;"
                " give each class one definition"
            )
        return
    classes.append((new, params))


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; directories become every *.yaml / *.yml file below them, sorted (as slogen reads them)."""
    return [f for p in paths for f in discover(p)]


def read_slo_files(paths: Sequence[str | Path], pipe_ok: bool = False) -> list[tuple[Path, bytes]]:
    """The bytes of every SLO file under `paths`, read as exporter.tap.slofiles allows (bounded, regular files;
    pipes too when `pipe_ok`, at start); SloConfigError naming the file otherwise."""
    try:
        for p in paths:
            if Path(p).is_dir():
                check_directory(Path(p))
        return read_sources(expand_paths(paths), pipe_ok)
    except SloSourceError as e:
        raise SloConfigError(str(e), e.reason) from None
    except OSError as e:
        raise SloConfigError(f"{e.filename}: cannot read the SLO file ({e.strerror}); check the --slo path",
                             "unreadable") from None


def _documents(path: Path, data: bytes, budget: int, allow_empty: bool) -> tuple[list[Any], int]:
    """The YAML documents of one file (slogen's strict reader) and the node budget left after it."""
    try:
        text = decode(data, str(path))
        budget -= count_nodes(text, str(path), budget)
        docs = load_documents(text, str(path))  # slogen's reader: strict UTF-8, no duplicate keys, bounded nesting
    except SloSourceError as e:
        raise SloConfigError(str(e), e.reason) from None
    except SpecFileError as e:
        raise SloConfigError(str(e)) from None
    if not docs and not allow_empty:
        raise SloConfigError(
            f"{path}: empty ({len(data)} bytes, no YAML document): a file rewritten in place is read while it is "
            "written, so the tap keeps the configuration in force (fix: write the new file beside the old one and "
            "rename it over it, as a ConfigMap update does)", "empty")
    return docs, budget


def _read_slos(path: Path, docs: list[Any], classes: list[tuple[SloClass, sli_plugins.GoodputParams]],
               thresholds: dict[str, set[float]]) -> None:
    """Add the goodput classes and tap latency thresholds of one file's documents."""
    for doc_index, doc in enumerate(docs):
        slos = _slo_lists(doc)
        if slos is None:
            continue
        if not isinstance(slos, list):
            raise SloConfigError(f"{path}: document {doc_index + 1}: slos must be a list of SLOs")
        for i, slo in enumerate(slos):
            if not isinstance(slo, dict):
                raise SloConfigError(f"{path}: slos[{i}] must be a mapping with name, objective and sli")
            origin = f"{path}: SLO {slo.get('name', f'#{i + 1}')!r}"
            plugin_id, options = _plugin(slo)
            if not sli_plugins.is_llmslo(plugin_id):
                continue  # Sloth events/raw SLIs and other plugins: nothing for the tap
            allow = slo.get(ALLOW_KEY) is True or slo.get("allowOutOfRange") is True  # the CRD's spelling
            params = _params(plugin_id, options, origin, allow)
            if isinstance(params, sli_plugins.GoodputParams):
                _merge(classes, SloClass(params.slo_class, params.ttft, params.tpot, params.selection.models,
                                         origin), params)
                if params.ttft is not None:
                    thresholds["ttft"].add(params.ttft)
                if params.tpot is not None:
                    thresholds["tpot"].add(params.tpot)
            elif isinstance(params, sli_plugins.LatencyParams) and params.source == sli_plugins.SOURCE_TAP:
                thresholds[params.metric].add(params.threshold)


def load_slo_config(paths: Sequence[str | Path], pipe_ok: bool = False, allow_empty: bool = True) -> SloConfig:
    """Read goodput classes and tap latency thresholds from SLO YAML files (or directories).

    `pipe_ok`: a pipe may stand for a file (at start: it is read once); `allow_empty`: a file with no YAML
    document is read as no SLOs (at start), else refused as a file caught half-written (a reload)."""
    classes: list[tuple[SloClass, sli_plugins.GoodputParams]] = []
    thresholds: dict[str, set[float]] = {m: set() for m in TAP_LATENCY_METRICS}
    files = read_slo_files(paths, pipe_ok)  # once: the bytes hashed are the bytes parsed
    budget = MAX_NODES
    for path, data in files:
        docs, budget = _documents(path, data, budget, allow_empty)
        _read_slos(path, docs, classes, thresholds)
    return SloConfig(tuple(cls for cls, _ in classes), {m: tuple(sorted(v)) for m, v in thresholds.items()},
                     config_hash([data for _, data in files]) if files else "")


def _objectives(cls: SloClass) -> str:
    parts = [f"{key}={value:g}s" for key, value in (("ttft", cls.ttft), ("tpot", cls.tpot)) if value is not None]
    return " ".join(parts + [f"models={','.join(cls.models)}"] if cls.models else parts) or "no objectives"


def describe_changes(old: SloConfig, new: SloConfig) -> list[str]:
    """What a reload changes, one short phrase each (for the tap's log line): classes added, removed or
    with other objectives, and thresholds added to or removed from each histogram."""
    out: list[str] = []
    before = {c.name: c for c in old.classes}
    after = {c.name: c for c in new.classes}
    for name in after.keys() - before.keys():
        out.append(f"class {name} added ({_objectives(after[name])})")
    for name in before.keys() - after.keys():
        out.append(f"class {name} removed")
    for name in sorted(before.keys() & after.keys()):
        a, b = before[name], after[name]
        if (a.ttft, a.tpot, a.models) != (b.ttft, b.tpot, b.models):
            out.append(f"class {name}: {_objectives(a)} -> {_objectives(b)}")
    for metric in sorted(set(old.thresholds) | set(new.thresholds)):
        was, now = set(old.thresholds.get(metric, ())), set(new.thresholds.get(metric, ()))
        if was != now:
            out.append(f"{metric} thresholds {','.join(f'{v:g}' for v in sorted(was)) or '-'} -> "
                       f"{','.join(f'{v:g}' for v in sorted(now)) or '-'}")
    return out

