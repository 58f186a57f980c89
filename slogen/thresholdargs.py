"""The thresholds on the command line: `--thresholds FILE`, one `slogen build` flag per threshold, and
`slogen thresholds`, which prints the default file or the docs table. Every flag's name, metavar, type and help
come from the threshold's row (slogen/rules/knobs.py); a flag given wins over the file (slogen/thresholds.py)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from llmslo.argtypes import number_arg
from llmslo.durations import parse_prometheus_duration
from slogen import thresholds
from slogen.errors import SpecError, SpecErrors, UsageError
from slogen.rules.capacity import CapacityOptions
from slogen.rules.health import HealthOptions
from slogen.rules.knobs import thresholds_of

SCHEMA_REF = "schemas/slogen.schema.json"  # the repository's thresholds.yaml sits beside schemas/


def duration(text: str) -> int:
    """argparse's type of a Prometheus duration flag: milliseconds."""
    try:
        return parse_prometheus_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# nan and inf are refused: every comparison with nan is false, and nothing exceeds inf.
finite = number_arg(float, math.isfinite, "a number", "a finite number; write e.g. 0.95")


def thresholds_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--thresholds", default=None, metavar="FILE",
                   help=f"the health and capacity alerts' thresholds ({thresholds.VERSION}; default: "
                        f"{thresholds.DEFAULT_HELP}, else the built-in defaults shown in `build --help`)")


def thresholds_problems(args: argparse.Namespace) -> list[SpecError]:
    """Everything `build` would refuse in the thresholds file, for `validate`."""
    try:
        thresholds.load(thresholds.path_for(args.paths, args.thresholds))
    except SpecErrors as e:
        return e.errors
    return []


def _flags(group: argparse._ArgumentGroup, section: str) -> None:
    """One flag per threshold, default None: a flag given overrides the thresholds file (`threshold_options`)."""
    for t in thresholds_of(thresholds.SECTIONS[section]):
        group.add_argument(thresholds.flag(section, t), type=duration if t.duration else finite, default=None,
                           metavar=t.knob.metavar, help=f"{t.help()} (default {t.show(t.default)})")


def threshold_flags(p: argparse.ArgumentParser) -> None:
    thresholds_arg(p)
    h = p.add_argument_group("health alerts", "the capacity and health alerts in alerts/llmslo-health.rules.yaml; "
                             "each threshold flag overrides the thresholds file (--thresholds)")
    h.add_argument("--no-health-alerts", dest="health_alerts", action="store_false",
                   help="do not generate the health alerts (nor their tests, PrometheusRule and runbooks)")
    _flags(h, "health")
    k = p.add_argument_group("capacity rules", "KV seats, their forecast and the capacity alerts in "
                             "alerts/llmslo-capacity.rules.yaml; each threshold flag overrides the thresholds file")
    k.add_argument("--no-capacity-rules", dest="capacity_rules", action="store_false",
                   help="do not generate the KV-seat rules and alerts (nor their tests, PrometheusRule and runbooks)")
    _flags(k, "capacity")


def threshold_options(args: argparse.Namespace) -> tuple[HealthOptions, CapacityOptions]:
    """The thresholds file's values (slogen.thresholds), with the flags given on top; SpecErrors for a bad file."""
    path = thresholds.path_for(args.paths or ["slos"], args.thresholds)
    if path is not None:
        print(f"note: alert thresholds read from {path}", file=sys.stderr)
    t = thresholds.load(path)

    def given(section: str) -> dict[str, Any]:
        prefix = thresholds.FLAG_PREFIX[section].replace("-", "_")
        return {x.name: getattr(args, prefix + x.name, None) for x in thresholds_of(thresholds.SECTIONS[section])}

    health = thresholds.options(HealthOptions, t.health, given("health"), args.health_alerts)
    capacity = thresholds.options(CapacityOptions, t.capacity, given("capacity"), args.capacity_rules)
    return health, capacity


def add_command(sub: Any) -> None:
    s = sub.add_parser("thresholds", help="print the thresholds file at the built-in defaults, each threshold with "
                                          "what it sets (or, --format markdown, the docs' table of them)")
    s.add_argument("--format", choices=("yaml", "markdown"), default="yaml",
                   help="yaml: a thresholds.yaml to edit (default); markdown: the table docs/slogen.md holds")
    s.add_argument("-o", "--out", default="-", metavar="PATH",
                   help="where to write it (default: -, standard output); with markdown, the file whose table "
                        "between the markers is replaced (the repository's: docs/slogen.md)")
    s.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs")


def _with_table(current: str, path: Path) -> str:
    """`current` (a markdown file) with the text between the table's markers replaced by the table."""
    start, end = current.find(thresholds.TABLE_BEGIN), current.find(thresholds.TABLE_END)
    if start < 0 or end < start:
        raise UsageError(f"--out {path} has no thresholds table markers: put {thresholds.TABLE_BEGIN!r} and "
                         f"{thresholds.TABLE_END!r} on their own lines where the table goes")
    return current[:start] + thresholds.TABLE_BEGIN + "\n" + thresholds.table() + current[end:]


def cmd_thresholds(args: argparse.Namespace) -> int:
    markdown = args.format == "markdown"
    if args.out == "-":
        if args.check:
            raise UsageError("--check needs --out PATH, the file to compare")
        sys.stdout.write(thresholds.table() if markdown else thresholds.render(SCHEMA_REF))
        return 0
    out = Path(args.out)
    current = out.read_text(encoding="utf-8") if out.is_file() else None
    if markdown and current is None:
        raise UsageError(f"--out {out}: with --format markdown, name the existing file that holds the table")
    text = _with_table(current, out) if markdown and current is not None else thresholds.render(SCHEMA_REF)
    if args.check:
        if current != text:
            print(f"slogen: {out} is stale: run `slogen thresholds --format {args.format} --out {out}`",
                  file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return 0
