"""`slogen build`: the catalog in, every generated file out, through the explicit list of steps.

Three stages: `slogen.catalog.compile_catalog` reads every input once and computes what several steps
share; each step of `slogen.steps.STEPS` reads only that catalog and returns what it produces (files
and notes); `slogen.outputs` writes the result (or compares it, for `--check`). Here the steps are run
and their products joined: files by path (two steps making one path is an error), notes in step order.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from slogen.catalog import BuildOptions, Catalog, compile_catalog
from slogen.errors import SpecError, SpecErrors
from slogen.steps import STEPS, Produced, Step

# From this many SLOs on, the forkable steps (the promtool tests: about 45% of a build) run in a forked child
# while this process runs the others: a 1,000-SLO build on 2 cores (bench slogen). Smaller builds stay in one process.
PARALLEL_MIN_SLOS = 100


@dataclass(frozen=True)
class Built:
    """A build's result: its catalog, every generated file (relative path -> text, sorted) and the steps' notes."""

    catalog: Catalog
    files: dict[str, str]
    notes: tuple[str, ...]


class _Forked:
    """One step run in a forked child (it inherits the catalog; nothing is pickled on the way in), what it
    produced handed back through a temporary file. Any failure in the child (an error in the specs included)
    makes `produced()` run the step here instead, so an error keeps its type, wording and place."""

    def __init__(self, step: Step, catalog: Catalog) -> None:
        """Raises OSError when no child can be started (the caller then runs the step itself)."""
        self.step, self.catalog = step, catalog
        fd, self.path = tempfile.mkstemp(prefix="slogen-build-", suffix=".pickle")
        os.close(fd)
        try:
            pid = os.fork()
        except OSError:
            os.unlink(self.path)
            raise
        if pid == 0:  # the child: run the step, hand back, never return into the caller's stack
            status = 1
            try:
                produced = step.run(catalog)
                with open(self.path, "wb") as f:
                    pickle.dump(produced, f, protocol=pickle.HIGHEST_PROTOCOL)
                status = 0
            finally:
                os._exit(status)
        self.pid = pid

    def _result(self) -> Produced | None:
        try:
            _, status = os.waitpid(self.pid, 0)
            if status != 0:
                return None
            with open(self.path, "rb") as f:
                return pickle.load(f)
        finally:
            os.unlink(self.path)

    def produced(self) -> Produced:
        done = self._result()
        return done if done is not None else self.step.run(self.catalog)

    def reap(self) -> None:
        self._result()


def _fork(catalog: Catalog, steps: Sequence[Step], parallel: bool | None) -> dict[int, _Forked]:
    """The forkable steps started in children, by their place in `steps`; none in a one-process build."""
    if not hasattr(os, "fork"):
        return {}
    if parallel is None:
        parallel = len(catalog.slos) >= PARALLEL_MIN_SLOS and (os.cpu_count() or 1) > 1
    forked: dict[int, _Forked] = {}
    for i, step in enumerate(steps):
        if parallel and step.forkable:
            try:
                forked[i] = _Forked(step, catalog)
            except OSError:
                break
    return forked


def _run(catalog: Catalog, steps: Sequence[Step], parallel: bool | None) -> list[Produced]:
    """Every step's product, in step order; the first error in step order is the one raised."""
    forked = _fork(catalog, steps, parallel)
    made: list[Produced | None] = []
    try:
        for i, step in enumerate(steps):
            made.append(None if i in forked else step.run(catalog))
    except BaseException:
        failed = len(made)
        for i, child in forked.items():
            if i >= failed:
                child.reap()
        for i, child in forked.items():
            if i < failed:
                child.produced()  # an error of an earlier step comes first, as in one process
        raise
    for i, child in forked.items():
        made[i] = child.produced()
    return made  # type: ignore[return-value]


def build(options: BuildOptions, steps: Sequence[Step] = STEPS, parallel: bool | None = None) -> Built:
    """The catalog, every generated file and the notes; nothing is written. `parallel`: run the forkable
    steps in forked children (default: from PARALLEL_MIN_SLOS SLOs on); same bytes, same notes."""
    catalog = compile_catalog(options)
    files: dict[str, str] = {}
    notes: list[str] = []
    for produced in _run(catalog, steps, parallel):
        for path, text in produced.files.items():
            if path in files:
                raise SpecErrors([SpecError(path, f"two build steps both produce {path}",
                                            fix="give each step its own output paths")])
            files[path] = text
        notes += produced.notes
    return Built(catalog, dict(sorted(files.items())), tuple(notes))
