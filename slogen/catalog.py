"""The build's one input: every file `slogen build` reads, loaded once, plus the rules compiled from it.

Generation reads only this catalog (`slogen.build`'s chain of generators), so nothing after
`compile_catalog` touches the disk until `slogen.outputs` writes the result. That is what makes a
build reproducible from its catalog, and a test able to feed the generators literals.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from slogen.autoscaling import DEFAULT_DIR as AUTOSCALING_DIR
from slogen.autoscaling import Pool
from slogen.autoscaling import load_paths as load_autoscaling
from slogen.errors import SpecError, SpecErrors
from slogen.loaders import load_paths
from slogen.loaders.windows import merge
from slogen.model import SLO, AlertWindows
from slogen.rules import SLOResult, generate
from slogen.rules.capacity import CapacityOptions
from slogen.rules.health import HealthOptions
from slogen.rules.options import GenOptions
from slogen.rules.tiers import override_error


@dataclass(frozen=True)
class BuildOptions:
    inputs: tuple[str, ...] = ("slos",)
    windows_paths: tuple[str, ...] = ()  # extra AlertWindows catalogs (AlertWindows found among inputs load too)
    gen: GenOptions = field(default_factory=GenOptions)
    health: HealthOptions = field(default_factory=HealthOptions)
    capacity: CapacityOptions = field(default_factory=CapacityOptions)
    autoscaling: bool = True  # generate KEDA objects from autoscaling/ next to the inputs


@dataclass
class Catalog:
    """Everything generation reads: the SLOs and their rules, the alert windows, the autoscaling
    pools and the SLO files' text (for the tap's ConfigMap)."""

    slos: list[SLO]
    results: list[SLOResult]
    windows: dict[int, AlertWindows]
    warnings: list[SpecError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. SLOs left without generated tests, and why
    pools: tuple[Pool, ...] = ()  # autoscaling/ next to the inputs (none with `--no-autoscaling`)
    spec_files: dict[str, str] = field(default_factory=dict)  # SLO file path under the root -> its text

    @property
    def services(self) -> dict[str, list[SLOResult]]:
        ordered = sorted(self.results, key=lambda r: r.slo.service)
        return {svc: list(items) for svc, items in itertools.groupby(ordered, key=lambda r: r.slo.service)}


def input_root(options: BuildOptions) -> Path:
    """Where the build's other inputs (`autoscaling/`) sit: next to the first input directory,
    i.e. the repository root for the default `slogen build` of `slos/`."""
    inputs = [Path(p) for p in options.inputs]
    if not inputs:
        return Path(".")
    return (inputs[0] if inputs[0].is_dir() else inputs[0].parent).parent


def spec_files(slos: list[SLO], root: Path) -> dict[str, str]:
    """The text of the SLO files the SLOs came from, keyed by their path under `root`."""
    out: dict[str, str] = {}
    for slo in slos:
        path = Path(slo.origin.file)
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = path.name
        if rel not in out and path.is_file():
            out[rel] = path.read_text(encoding="utf-8")
    return out


def compile_catalog(options: BuildOptions) -> Catalog:
    """Load and validate every input, and generate the rules of every SLO; SpecErrors lists every
    problem, AutoscalingError the first in autoscaling/."""
    loaded = load_paths(list(options.inputs))
    extra = load_paths(list(options.windows_paths), windows_only=True).windows if options.windows_paths else []
    windows = merge(loaded.windows + extra, dict(options.gen.windows))
    gen = GenOptions(**{**options.gen.__dict__, "windows": windows})
    refused = override_error(gen)
    if refused is not None:
        raise SpecErrors([refused])
    results = generate(loaded.slos, gen)
    root = input_root(options)
    pools = load_autoscaling([root / AUTOSCALING_DIR]).pools if options.autoscaling else ()
    return Catalog(loaded.slos, results, windows, loaded.warnings, pools=pools,
                   spec_files=spec_files(loaded.slos, root))
