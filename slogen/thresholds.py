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
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmslo import fields
from llmslo.suggest import closest
from slogen.errors import SpecError, SpecErrors, SpecFields, load_mapping_file
from slogen.rules.capacity import CapacityOptions
from slogen.rules.health import HealthOptions
from slogen.rules.knobs import Threshold, thresholds_of

VERSION = "llmslo/thresholds/v1"
DEFAULT_NAME = "thresholds.yaml"
DEFAULT_HELP = f"{DEFAULT_NAME} beside the first input directory, e.g. ./{DEFAULT_NAME} for slos/, when it exists"
SECTIONS: dict[str, type] = {"health": HealthOptions, "capacity": CapacityOptions}
FLAG_PREFIX = {"health": "", "capacity": "capacity-"}  # a section's flags: --<prefix><field with dashes>


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Each section's values as the file gives them (field name -> value); flags are applied by `options`."""

    path: Path | None = None
    health: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    capacity: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def settable(cls: type) -> dict[str, type]:
    """A section's threshold fields and their kind: int fields are durations (in ms), float ones numbers."""
    return {t.name: (int if t.duration else float) for t in thresholds_of(cls)}


def flag(section: str, t: Threshold) -> str:
    """The `slogen build` flag that overrides a threshold of a section."""
    return f"--{FLAG_PREFIX[section]}{t.name.replace('_', '-')}"


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
    """The thresholds a section gives (field name -> ms or number); each problem recorded in `errors`."""
    if data is None:
        return {}
    node = SpecFields(file, name, data, errors, line)
    rows = {t.name: t for t in thresholds_of(SECTIONS[name])}
    out: dict[str, Any] = {}
    for key in node.data:
        t = rows.get(str(key))
        if t is None:
            close = closest(str(key), tuple(rows))
            node.error(str(key), "unknown threshold", f"did you mean {close!r}?" if close else f"one of {', '.join(rows)}")
            continue
        value = node.get(t.name, fields.duration if t.duration else _number(t), None)
        if value is not None:
            out[t.name] = value
    return out


def _number(t: Threshold) -> Callable[[Any], float]:
    return lambda value: fields.finite(value, f"e.g. {t.show(t.default)}")


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


HEADER = f"""\
# The thresholds of the health and capacity alerts `slogen build` generates (alerts/llmslo-health.rules.yaml,
# alerts/llmslo-capacity.rules.yaml). Read by `slogen build` and `slogen validate` (beside slos/, or
# --thresholds FILE); a flag on the command line (e.g. --kv-usage-threshold 0.9) wins over this file.
# Durations are Prometheus durations in whole minutes; the values below are the built-in defaults.
version: "{VERSION}"
"""


def render(schema_ref: str) -> str:
    """The thresholds file at the built-in defaults, each threshold with what it sets as its comment (the
    repository's thresholds.yaml, and the one `slogen init` writes); `schema_ref` is the JSON Schema's location."""
    lines = [f"# yaml-language-server: $schema={schema_ref}", HEADER.rstrip("\n")]
    for section, cls in SECTIONS.items():
        lines += ["", f"{section}:"]
        for t in thresholds_of(cls):
            accepts = "" if t.duration else f"; {_accepts(t)}"  # durations: the header says
            lines += textwrap.wrap(f"{t.help()}{accepts}.", 112, initial_indent="  # ", subsequent_indent="  # ")
            lines.append(f"  {t.name}: {t.show(t.default)}")
    return "\n".join(lines) + "\n"


def _accepts(t: Threshold) -> str:
    return t.knob.accepts.split(", e.g.")[0]


def table() -> str:
    """The docs' table of every threshold (docs/slogen.md, between the TABLE_BEGIN and TABLE_END markers)."""
    rows = ["| file key | flag | default | accepts | sets |", "|---|---|---|---|---|"]
    for section, cls in SECTIONS.items():
        for t in thresholds_of(cls):
            rows.append(f"| `{section}.{t.name}` | `{flag(section, t)} {t.knob.metavar}` | {t.show(t.default)} | "
                        f"{_accepts(t)} | {t.help().replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"


TABLE_BEGIN = ("<!-- the thresholds table: generated by `slogen thresholds --format markdown --out docs/slogen.md` from "
               "the knobs of slogen/rules/health.py and capacity.py; edit those -->")
TABLE_END = "<!-- end of the thresholds table -->"
