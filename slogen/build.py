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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slogen.catalog import BuildOptions, Catalog, compile_catalog
from slogen.errors import SpecError, SpecErrors
from slogen.outtree import Content
from slogen.paths import is_promtool_test
from slogen.steps import STEPS, Produced, Step, pairs

# From this many SLOs on, the forkable steps (the promtool tests and the dashboards: about 70% of a build's own CPU)
# run in forked children while this process runs the others (and promtool checks the rule files): a 1,000-SLO build
# on 2 cores (bench slogen). Smaller builds stay in one process.
PARALLEL_MIN_SLOS = 100

OnStep = Callable[[Mapping[str, Content]], None]  # one step's files, once it has made them all


@dataclass(frozen=True)
class Built:
    """A build's result: its catalog, every generated file (relative path -> content, sorted) and the steps' notes."""

    catalog: Catalog
    files: dict[str, Content]
    notes: tuple[str, ...]


def write_scratch(base: Path, rel: str, text: str) -> Path:
    """One generated file into a scratch tree (the build's, or a forked step's): the text leaves memory."""
    path = base / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


class _Forked:
    """One step run in a forked child (it inherits the catalog; nothing is pickled on the way in). The child
    writes its files into a scratch directory of its own as it makes them and hands back their paths and the
    notes through a temporary file. Any failure in the child (an error in the specs included) makes
    `produced()` run the step here instead, so an error keeps its type, wording and place."""

    def __init__(self, step: Step, catalog: Catalog, scratch: Path) -> None:
        """Raises OSError when no child can be started (the caller then runs the step itself)."""
        self.step, self.catalog = step, catalog
        self.dir = Path(tempfile.mkdtemp(prefix=f"step-{step.name}-", dir=scratch))
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
                paths = [rel for rel, text in pairs(produced.files) if write_scratch(self.dir, rel, text)]
                with open(self.path, "wb") as f:
                    pickle.dump((paths, list(produced.notes)), f, protocol=pickle.HIGHEST_PROTOCOL)
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
                paths, notes = pickle.load(f)
            return Produced({rel: self.dir / rel for rel in paths}, tuple(notes))  # type: ignore[dict-item]
        finally:
            os.unlink(self.path)

    def produced(self) -> Produced:
        done = self._result()
        return done if done is not None else self.step.run(self.catalog)

    def reap(self) -> None:
        self._result()


def _fork(catalog: Catalog, steps: Sequence[Step], parallel: bool | None, scratch: Path) -> dict[int, _Forked]:
    """The forkable steps started in children, by their place in `steps`; none in a one-process build."""
    if not hasattr(os, "fork"):
        return {}
    if parallel is None:
        parallel = len(catalog.slos) >= PARALLEL_MIN_SLOS and (os.cpu_count() or 1) > 1
    forked: dict[int, _Forked] = {}
    for i, step in enumerate(steps):
        if parallel and step.forkable and (not step.fork_max_slos or len(catalog.slos) <= step.fork_max_slos):
            try:
                forked[i] = _Forked(step, catalog, scratch)
            except OSError:
                break
    return forked


def _join(options: BuildOptions, steps: Sequence[Step], parallel: bool | None, scratch: Path,
          keep: Callable[[str, str], Content], on_step: OnStep | None = None) -> Built:
    """Run the steps (the forkable ones in children meanwhile), each file given to `keep` as it is made (what
    it returns is the file's content in the result; a forked step's file stays where the child wrote it, read
    back only for an in-memory build), and each step's files to `on_step` once it has made them all. Notes in
    step order; the first error in step order is the one raised.
    Without promtool tests (the settings' promtoolTests: false) their files are left out and the steps that
    make nothing else are not run."""
    catalog = compile_catalog(options)
    if not options.promtool_tests:
        steps = [s for s in steps if not s.tests_only]
    files: dict[str, Content] = {}
    notes: list[Sequence[str]] = [()] * len(steps)

    def take(i: int, produced: Produced) -> None:
        made: dict[str, Content] = {}
        for path, content in pairs(produced.files):
            if not options.promtool_tests and is_promtool_test(path):
                continue
            if path in files:
                raise SpecErrors([SpecError(path, f"two build steps both produce {path}",
                                            fix="give each step its own output paths")])
            files[path] = made[path] = _kept(content, keep) if isinstance(content, Path) else keep(path, content)
        notes[i] = produced.notes
        if on_step is not None:
            on_step(made)

    forked = _fork(catalog, steps, parallel, scratch)
    failed = -1
    try:
        for failed, step in enumerate(steps):
            if failed not in forked:
                take(failed, step.run(catalog))
        failed = len(steps)
    except BaseException:
        for i, child in forked.items():
            if i > failed:
                child.reap()
        for i, child in forked.items():
            if i < failed:
                child.produced()  # an error of an earlier step comes first, as in one process
        raise
    try:
        for i in sorted(forked):
            take(i, forked.pop(i).produced())
    finally:
        for child in forked.values():  # a later child, after an earlier one's error
            child.reap()
    return Built(catalog, dict(sorted(files.items())), tuple(n for step_notes in notes for n in step_notes))


def _kept(scratch_file: Path, keep: Callable[[str, str], Content]) -> Content:
    """A forked step's file: its text for an in-memory build, else the file itself."""
    return scratch_file if keep is not _in_memory else scratch_file.read_text(encoding="utf-8")


def _in_memory(path: str, text: str) -> Content:
    return text


def build(options: BuildOptions, steps: Sequence[Step] = STEPS, parallel: bool | None = None) -> Built:
    """The catalog, every generated file's text and the notes; nothing is written. `parallel`: run the
    forkable steps in forked children (default: from PARALLEL_MIN_SLOS SLOs on); same bytes, same notes."""
    with tempfile.TemporaryDirectory(prefix="slogen-build-") as scratch:
        return _join(options, steps, parallel, Path(scratch), _in_memory)


def build_into(options: BuildOptions, scratch: Path, steps: Sequence[Step] = STEPS,
               parallel: bool | None = None, on_step: OnStep | None = None) -> Built:
    """The same build, each file written under `scratch` as it is made (the files map to those paths): a
    build's memory is its catalog and one service's files, not every file's text (10,000 SLOs: 1.8 GB).
    `on_step` is given each step's files (path -> scratch file) as soon as the step is done: the CLI starts
    `promtool check rules` on the rule files then, so the check runs while the build makes the rest."""
    main = scratch / "main"
    return _join(options, steps, parallel, scratch, lambda rel, text: write_scratch(main, rel, text), on_step)
