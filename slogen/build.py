"""`slogen build`: the catalog in, every generated file out, as an ordered chain of generators.

Three stages: `slogen.catalog.compile_catalog` reads every input once; each artifact generator,
`(catalog, options) -> {relative path: text}`, reads only the catalog and the options and opens
no file (tests/slogen/test_layout.py holds them to it); `slogen.outputs` writes the result (or
compares it, for `--check`). To add an artifact, append its generator to `ARTIFACT_GENERATORS`.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Callable

from slogen.artifacts.alertmanager import alertmanager_files
from slogen.artifacts.dashboards import remembering
from slogen.artifacts.files import artifact_files
from slogen.catalog import BuildOptions, Catalog, compile_catalog
from slogen.errors import SpecError, SpecErrors
from slogen.promtests.dashboards import dashboard_test_files
from slogen.promtests.files import rule_tests
from slogen.rules.files import capacity_rules, health_rules, prometheus_rules, rule_files

ArtifactGenerator = Callable[[Catalog, BuildOptions], dict[str, str]]

# The build, in order. Append artifact generators here.
ARTIFACT_GENERATORS: list[ArtifactGenerator] = [
    rule_files,  # alerts/<service>.rules.yaml
    rule_tests,  # alerts/<service>.test.yaml
    prometheus_rules,  # deploy/generated/prometheusrule-<service>.yaml
    health_rules,  # alerts/llmslo-health.*, its PrometheusRule
    capacity_rules,  # alerts/llmslo-capacity.*, its PrometheusRule
    artifact_files,  # dashboards/, docs/runbooks/, KEDA and HPA, deploy/ (artifacts/files.py)
    dashboard_test_files,  # dashboards/dashboards.test.yaml: every panel's number on a synthetic fleet
    alertmanager_files,  # alerts/alertmanager.yaml: routing and inhibition (artifacts/alertmanager.py)
]


# From this many SLOs on, the promtool tests (about 45% of a build) are generated in a forked child while this
# process makes everything else: a 1,000-SLO build on 2 cores (bench slogen). Smaller builds stay in one process.
PARALLEL_MIN_SLOS = 100


class _Forked:
    """One generator run in a forked child (it inherits the catalog; nothing is pickled on the way in), its files
    and the notes it added handed back through a temporary file. Any failure in the child (an error in the
    specs included) leaves `result()` None, and the caller runs the generator itself: errors keep their type,
    wording and order."""

    def __init__(self, gen: ArtifactGenerator, catalog: Catalog, options: BuildOptions) -> None:
        """Raises OSError when no child can be started (the caller then builds in one process)."""
        fd, self.path = tempfile.mkstemp(prefix="slogen-build-", suffix=".pickle")
        os.close(fd)
        notes_before = len(catalog.notes)
        try:
            pid = os.fork()
        except OSError:
            os.unlink(self.path)
            raise
        if pid == 0:  # the child: generate, hand back, never return into the caller's stack
            status = 1
            try:
                out = gen(catalog, options)
                with open(self.path, "wb") as f:
                    pickle.dump((out, catalog.notes[notes_before:]), f, protocol=pickle.HIGHEST_PROTOCOL)
                status = 0
            finally:
                os._exit(status)
        self.pid = pid

    def result(self) -> tuple[dict[str, str], list[str]] | None:
        try:
            _, status = os.waitpid(self.pid, 0)
            if status != 0:
                return None
            with open(self.path, "rb") as f:
                return pickle.load(f)
        finally:
            os.unlink(self.path)


def _forked_tests(catalog: Catalog, options: BuildOptions, chain: list[ArtifactGenerator],
                  parallel: bool | None) -> _Forked | None:
    """The promtool tests started in a child, or None: one process (not asked for, no fork, fork failed)."""
    if rule_tests not in chain or not hasattr(os, "fork"):
        return None
    if parallel is None:
        parallel = len(catalog.slos) >= PARALLEL_MIN_SLOS and (os.cpu_count() or 1) > 1
    if not parallel:
        return None
    try:
        return _Forked(rule_tests, catalog, options)
    except OSError:
        return None


def build(options: BuildOptions, generators: list[ArtifactGenerator] | None = None,
          parallel: bool | None = None) -> tuple[Catalog, dict[str, str]]:
    """The catalog and every generated file (relative path -> text, sorted); nothing is written. `parallel`:
    generate the promtool tests in a forked child (default: from PARALLEL_MIN_SLOS SLOs on); same bytes."""
    catalog = compile_catalog(options)
    chain = ARTIFACT_GENERATORS if generators is None else generators
    forked = _forked_tests(catalog, options, chain, parallel)
    artifacts: dict[str, str] = {}

    def add(files: dict[str, str]) -> None:
        for path, text in files.items():
            if path in artifacts:
                raise SpecErrors([SpecError(path, f"two artifact generators both produce {path}",
                                            fix="give each generator its own output paths")])
            artifacts[path] = text

    notes_at = len(catalog.notes)  # where the forked generator's notes go, as if it had run in its place

    def forked_files() -> dict[str, str]:
        done = forked.result()
        if done is None:  # the child failed: the generator again, here, so an error is raised as it would be
            before = len(catalog.notes)
            done = (rule_tests(catalog, options), catalog.notes[before:])
            del catalog.notes[before:]
        catalog.notes[notes_at:notes_at] = done[1]
        return done[0]

    gen = chain[0]
    try:
        with remembering():  # the dashboards are rendered once for the files and their tests
            for gen in chain:
                if forked is not None and gen is rule_tests:
                    notes_at = len(catalog.notes)
                    continue
                add(gen(catalog, options))
    except BaseException:
        if forked is not None:
            if chain.index(rule_tests) < chain.index(gen):
                forked_files()  # an error of the tests, which come first in the chain, is the one to raise
            else:
                forked.result()  # reap the child and its file
        raise
    if forked is not None:
        add(forked_files())
    return catalog, dict(sorted(artifacts.items()))
