"""The autoscaling pools a build reads: which directory, and the one validation `validate` and `build` share.

The directory is `--autoscaling DIR`, by default `autoscaling/` beside the first input directory (the
repository root's `autoscaling/` for `slogen build slos/`); both commands say which one they read, or that
there is none (then no KEDA or HPA objects are made). Every problem, in the files or in what a pool says
about the SLOs (a burn-rate trigger naming an SLO that does not exist, checked for a pool with other problems too),
comes back at once, as SpecErrors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slogen.artifacts.keda import slo_problem
from slogen.autoscaling import DEFAULT_DIR, Pool, read_paths
from slogen.errors import SpecError
from slogen.views import SLOView

DEFAULT_HELP = f"{DEFAULT_DIR}/ beside the first input directory, e.g. ./{DEFAULT_DIR} for slos/"


def input_root(inputs: Sequence[str | Path]) -> Path:
    """Where the build's other inputs sit: beside the first input directory (the parent of a file's folder)."""
    paths = [Path(p) for p in inputs]
    if not paths:
        return Path(".")
    return (paths[0] if paths[0].is_dir() else paths[0].parent).parent


def directory(inputs: Sequence[str | Path], given: str | None) -> Path:
    """`--autoscaling DIR` when given, else the default beside the inputs."""
    return Path(given) if given else input_root(inputs) / DEFAULT_DIR


def note(path: Path, given: bool) -> str:
    """What a build or validation says about the directory it read (or did not find)."""
    how = "--autoscaling" if given else f"the default: {DEFAULT_HELP}"
    if path.exists():
        return f"autoscaling specs read from {path} ({how})"
    return (f"no autoscaling specs: {path} does not exist ({how}), so no KEDA or HPA objects are made; "
            "pass --autoscaling DIR to read them elsewhere, or --no-autoscaling to say none are wanted")


def read_pools(path: Path, views: Sequence[SLOView]) -> tuple[tuple[Pool, ...], list[SpecError]]:
    """The pools under `path` and every problem in them, those found against the SLOs' views included."""
    spec, errors = read_paths([path]) if path.exists() else (None, [])
    if spec is None:
        return (), errors
    refused = {(e.file, e.field) for e in errors}
    for pool in spec.read:  # a pool with other problems too: all of them in one run
        burn = pool.ttft_burn_rate
        if burn is not None and (burn.file, burn.field) not in refused:
            _, problem = slo_problem(pool, views)
            if problem is not None and (problem.file, problem.field) not in refused:  # a refused window: said once
                errors.append(problem)
    return spec.pools, errors
