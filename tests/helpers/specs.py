"""Specs for tests: load SLO specs in one call; a one-pool autoscaling spec around the triggers under test."""

from __future__ import annotations

from pathlib import Path

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
