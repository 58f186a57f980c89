"""The health and capacity alerts' thresholds from one checked-in, commented file; flags override it.

`thresholds.yaml` (version `llmslo/thresholds/v1`) sits beside the first input directory, as `autoscaling/`
does (`./thresholds.yaml` for `slogen build slos/`), or wherever `--thresholds FILE` points:

    version: "llmslo/thresholds/v1"
    health:   {kv_usage_threshold: 0.95, kv_saturated_for: 10m, ...}   # HealthOptions' fields
    capacity: {seats_low: 4, exhaustion_minutes: 15, ...}              # CapacityOptions' fields

A key is an option's field name; a duration is written as Prometheus writes one (`10m`), a number as a
number. What the file leaves out keeps its built-in default; a flag given on the command line wins over
both. Every problem of the file comes back at once, as SpecErrors with the line and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmslo.durations import parse_prometheus_duration
from llmslo.suggest import closest
from slogen.errors import SpecError, SpecErrors, load_mapping_file
from slogen.rules.capacity import CapacityOptions
from slogen.rules.health import HealthOptions

VERSION = "llmslo/thresholds/v1"
DEFAULT_NAME = "thresholds.yaml"
DEFAULT_HELP = f"{DEFAULT_NAME} beside the first input directory, e.g. ./{DEFAULT_NAME} for slos/, when it exists"
SECTIONS: dict[str, type] = {"health": HealthOptions, "capacity": CapacityOptions}
# Fields that are switches or set by the build itself, not thresholds.
NOT_THRESHOLDS = frozenset({"enabled", "tap_config_hash"})


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Each section's values as the file gives them (field name -> value); flags are applied by `options`."""

    path: Path | None = None
    health: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    capacity: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def settable(cls: type) -> dict[str, type]:
    """A section's threshold fields and their kind: int fields are durations (in ms), float ones numbers."""
    return {f.name: (int if f.type in (int, "int") else float) for f in dataclasses.fields(cls)
            if f.name not in NOT_THRESHOLDS}


def path_for(inputs: Sequence[str | Path], given: str | None) -> Path | None:
    """`--thresholds FILE` when given; else the default file when it exists; else None (built-in defaults)."""
    if given:
        return Path(given)
    from slogen.pools import input_root

    default = input_root(inputs) / DEFAULT_NAME
    return default if default.exists() else None


def load(path: Path | None) -> Thresholds:
    if path is None:
        return Thresholds()
    file = str(path)
    doc = load_mapping_file(path, "thresholds file", "pass an existing file to --thresholds", f'version: "{VERSION}"')
    errors: list[SpecError] = []
    if doc.get("version") != VERSION:
        errors.append(SpecError(file, f"version is {doc.get('version')!r}", "version", line=_line(doc, "version"),
                                fix=f'write version: "{VERSION}"'))
    for key in doc:
        if key != "version" and key not in SECTIONS:
            close = closest(str(key), tuple(SECTIONS))
            errors.append(SpecError(file, f"unknown section {key!r}", str(key), line=_line(doc, key),
                                    fix=f"did you mean {close!r}?" if close else f"use {' or '.join(SECTIONS)}"))
    sections = {name: _section(file, name, doc.get(name), _line(doc, name), errors) for name in SECTIONS}
    read = Thresholds(path, sections["health"], sections["capacity"])
    errors += problems(read, doc)
    if errors:
        raise SpecErrors(errors)
    return read


def _line(node: Any, key: Any) -> int | None:
    line_of = getattr(node, "line_of", None)
    return line_of(key) if line_of else getattr(node, "line", None)


def _section(file: str, name: str, data: Any, line: int | None, errors: list[SpecError]) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        errors.append(SpecError(file, f"expected a mapping, got {type(data).__name__}", name, line=line,
                                fix=f"write {name}: followed by `option: value` lines"))
        return {}
    fields = settable(SECTIONS[name])
    out: dict[str, Any] = {}
    for key, value in data.items():
        where, at = f"{name}.{key}", _line(data, key)
        kind = fields.get(str(key))
        if kind is None:
            close = closest(str(key), tuple(fields))
            errors.append(SpecError(file, "unknown threshold", where, line=at,
                                    fix=f"did you mean {close!r}?" if close else f"one of {', '.join(fields)}"))
        elif kind is int:
            try:
                out[key] = parse_prometheus_duration(str(value))
            except ValueError:
                errors.append(SpecError(file, f"{value!r} is not a duration", where, line=at, fix="write e.g. 10m"))
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            errors.append(SpecError(file, f"{value!r} is not a finite number", where, line=at, fix="write e.g. 0.95"))
        else:
            out[key] = float(value)
    return out


def options(cls: type, file_values: Mapping[str, Any], flags: Mapping[str, Any], enabled: bool) -> Any:
    """`cls` (HealthOptions or CapacityOptions) from its defaults, then the file, then the flags given."""
    given = {k: v for k, v in flags.items() if v is not None}
    return cls(enabled=enabled, **{**file_values, **given})


def problems(t: Thresholds, doc: Any = None) -> list[SpecError]:
    """What `slogen build` would refuse in the file's values (each section's own checks), with the file and line."""
    file = str(t.path) if t.path else "slogen build"
    out = []
    for name, values in (("health", t.health), ("capacity", t.capacity)):
        section = doc.get(name) if isinstance(doc, dict) else None
        for option, why in options(SECTIONS[name], values, {}, True).problems():
            key = option.removeprefix("capacity_") if name == "capacity" else option
            out.append(SpecError(file, f"{key} {why}", f"{name}.{key}", line=_line(section, key) if section else None,
                                 fix=f"correct {key} in the file, or leave it out for the default"))
    return out


# Each threshold flag: (its options field, metavar, help with `{}` where the default goes). The field's kind
# (slogen.thresholds.settable) gives the type: durations parse and show as Prometheus durations, the rest as numbers.
HEALTH_FLAGS = (
    ("gpu_lost_for", "DURATION", "LLMGpuLost: how long llm_gpu_up is 0 before it fires (default {})"),
    ("gpu_error_window", "WINDOW", "LLMGpuXidErrors, LLMGpuEccUncorrectedErrors: window of the error increase "
                                   "(default {})"),
    ("target_down_for", "DURATION", "LLMEngineTargetDown: how long a target is unreadable (default {})"),
    ("kv_usage_threshold", "RATIO", "LLMKVCacheSaturated: KV-cache usage ratio, with requests waiting (default {})"),
    ("kv_saturated_for", "DURATION", "LLMKVCacheSaturated: how long before it fires (default {})"),
    ("preemption_rate", "PER_SECOND", "LLMPreemptionStorm: preemptions per second per engine (default {})"),
    ("preemption_window", "WINDOW", "LLMPreemptionStorm: rate window (default {})"),
    ("preemption_for", "DURATION", "LLMPreemptionStorm: how long before it fires (default {})"),
    ("tap_refusal_rate", "PER_SECOND", "LLMTapRefusingRequests: refusals per second per tap at its connection or "
                                       "body-memory limit (default {}: any)"),
    ("tap_refusal_window", "WINDOW", "LLMTapRefusingRequests: rate window (default {})"),
    ("tap_refusal_for", "DURATION", "LLMTapRefusingRequests: how long before it fires, longer than the window "
                                    "(default {})"),
    ("tap_config_drift_for", "DURATION", "LLMTapConfigDrift: how long a tap reports other SLO files than the "
                                         "build's before it fires (default {})"),
)
CAPACITY_FLAGS = (  # flags --capacity-<field>
    ("footprint_window", "WINDOW", "rate window of the request-size histograms behind the p99/p50 footprint "
                                   "(default {})"),
    ("trend_window", "WINDOW", "deriv() window of the time-to-exhaustion forecast and the queue trend (default {})"),
    ("seats_low", "SEATS", "LLMKVSeatsLow: a pool under this many seats at p99 context (default {})"),
    ("seats_low_for", "DURATION", "LLMKVSeatsLow: how long before it fires (default {})"),
    ("exhaustion_minutes", "MINUTES", "LLMKVSeatsExhaustion: forecast minutes to no seat left, with the queue "
                                      "growing (default {})"),
    ("exhaustion_for", "DURATION", "LLMKVSeatsExhaustion: how long before it fires (default {})"),
    ("wave_period", "WINDOW", "LLMKVSeatsExhaustion: the forecast holds only under the pool's lowest free tokens "
                              "over this long before the trend window, so a load wave up to this period does not "
                              "page (default {})"),
)
