"""Spec errors that say where (file, line, SLO, field), what is wrong, and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmslo.fields import Fields
from llmslo.problems import describe


@dataclass(frozen=True)
class SpecError(Exception):
    """One problem in an input file.

    `field` is a path into the document as the user wrote it (`slos[1].sli.events.error_query`),
    `slo` the SLO's id or name when the problem belongs to one SLO, `fix` a concrete next step.
    """

    file: str
    message: str
    field: str = ""
    slo: str = ""
    fix: str = ""
    line: int | None = None

    def __str__(self) -> str:
        return describe(self.file, self.message, line=self.line, field=self.field, slo=self.slo, fix=self.fix)


class SpecErrors(Exception):
    """Every problem found in one load or validation pass, so users fix them all at once."""

    def __init__(self, errors: list[SpecError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    def __iter__(self):
        return iter(self.errors)


def load_mapping_file(path: Path, what: str, fix: str, start: str) -> Any:
    """The one YAML mapping a settings-like file holds (the thresholds, the install's settings); SpecErrors
    naming the file, and `fix` when it cannot be read, `start` when it is not one mapping."""
    from llmslo.specfile import SpecFileError, load_documents

    file = str(path)
    try:
        documents = load_documents(path.read_bytes(), file)
    except OSError as e:
        raise SpecErrors([SpecError(file, f"cannot read the {what} ({e.strerror})", fix=fix)]) from None
    except SpecFileError as e:
        raise SpecErrors([SpecError(file, e.message, line=e.line, fix=e.fix)]) from None
    doc = documents[0] if len(documents) == 1 else None
    if not isinstance(doc, dict):
        raise SpecErrors([SpecError(file, f"expected one YAML mapping ({start})", fix=f"start the file with {start}")])
    return doc


class UsageError(Exception):
    """A command line slogen refuses (exit status 2): the message names the flag and what to give instead."""


class SpecFields(Fields):
    """llmslo.fields' reader of one mapping, recording each problem as a SpecError (the thresholds file, the
    autoscaling specs). A key written with no value (null) is refused, not read as absent."""

    NULL_IS_ABSENT = False

    def problem(self, key: str, message: str, fix: str) -> SpecError:
        return SpecError(self.file, message, self.field(key), "", fix, self.line_of(key))
