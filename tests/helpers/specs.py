"""Specs for tests: load SLO specs in one call; Sloth specs from one-line SLOs; autoscaling specs built on the
documented example or around one pool's triggers under test."""

from __future__ import annotations

import textwrap
from pathlib import Path

from slogen import autoscaling
from slogen.loaders import load_paths
from slogen.model import SLO


def load_path(path: str | Path) -> list[SLO]:
    """The SLOs in a file or directory; raises SpecErrors listing every problem."""
    return load_paths([path]).slos


ONE_POOL = """version: "llmslo/autoscaling/v1"
pools:
  - name: p
    namespace: llm
    target: {name: d}
    replicas: {max: 4}
    match: {model: m}
    triggers:
      %s
"""


def one_pool(trigger: str) -> str:
    """An autoscaling spec of one pool whose triggers are `trigger` (one YAML line); the trigger is on line 9."""
    return ONE_POOL % trigger


def documented_pool(through: str) -> str:
    """The autoscaling example in slogen/autoscaling.py's docstring, from `version:` down to its first line that
    starts with `through` (after indentation): tests build on the documented spec instead of copying it."""
    doc = autoscaling.__doc__ or ""
    block = [line for line in doc.splitlines(keepends=True) if line.startswith("    ")]
    lines = textwrap.dedent("".join(block)).splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if line.strip().startswith(through))
    return "".join(lines[: end + 1])


def slo_entry(name: str, objective: float, sli: str, alerting: str | None = None) -> str:
    """One SLO of a Sloth spec; `sli` and `alerting` are one YAML flow-style line each."""
    text = f'  - name: "{name}"\n    objective: {objective}\n    sli: {sli}\n'
    return text + (f"    alerting: {alerting}\n" if alerting is not None else "")


def sloth_spec(service: str, *slos: str) -> str:
    """A Sloth prometheus/v1 spec of `service` holding `slos` (each made by `slo_entry`)."""
    return f'version: "prometheus/v1"\nservice: "{service}"\nslos:\n' + "".join(slos)


def events_sli(metric: str) -> str:
    """A Sloth events SLI in block style, laid out for an SLO under `slos:`: the share of `metric` with a 5xx code."""
    return ("    sli:\n      events:\n"
            f'        error_query: sum(rate({metric}{{code=~"5.."}}[{{{{.window}}}}]))\n'
            f"        total_query: sum(rate({metric}[{{{{.window}}}}]))\n")
