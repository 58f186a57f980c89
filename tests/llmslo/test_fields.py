"""The one field reader (llmslo/fields.py): each reader's type and range, each problem in the one shape with its
file, line and field path, and every input format reading through it."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from llmslo import fields
from llmslo.fields import FieldError, Fields, Problem
from llmslo.specfile import load_documents

REPO = Path(__file__).resolve().parents[2]


def test_readers_return_the_type_or_say_what_is_wrong_and_the_fix():
    assert fields.text(8000) == "8000" and fields.scalar(True) == "true" and fields.boolean(False) is False
    assert fields.finite(3) == 3.0 and fields.finite("99.9", strings=True) == 99.9
    assert fields.duration("1h30m") == 5_400_000 and fields.seconds(3600)("5m") == 300
    assert fields.number(0, 10, integer=True)(4) == 4
    cases = [
        (lambda: fields.text(["a"]), "expected a string, got ['a']", ""),
        (lambda: fields.boolean("yes"), "expected true or false, got 'yes'", "write true or false"),
        (lambda: fields.finite("99.9"), "expected a number, got '99.9'", "write e.g. 0.95"),  # strings only when asked
        (lambda: fields.finite(True, strings=True), "expected a number, got True", "write e.g. 0.95"),
        (lambda: fields.finite(math.inf, "objective: 99.9"), ".inf is not a finite number", "write objective: 99.9 ("),
        (lambda: fields.finite("nan", strings=True), "'nan' is not a finite number", "write e.g. 0.95 ("),
        (lambda: fields.number(0.1)(0.0), "expected a number at least 0.1, got 0.0", "write a number at least 0.1"),
        (lambda: fields.number(0, 10, integer=True)(2.5), "expected a whole number between 0 and 10, got 2.5", ""),
        (lambda: fields.number(0.1)(-math.inf), "-.inf is not a finite number", "write a number of at least 0.1"),
        (lambda: fields.duration("soon"), "'soon' is not a duration", "write e.g. 10m"),
        (lambda: fields.seconds(60)("90s"), "'90s' is out of range", "use at most 60s"),
        (lambda: fields.seconds(60)("1500ms"), "'1500ms' is not a duration in whole seconds", "write e.g. 30s"),
        (lambda: fields.positive_int(0), "expected a whole number above zero, got 0", ""),
    ]
    for read, message, fix in cases:
        with pytest.raises(FieldError) as err:
            read()
        assert str(err.value) == message and err.value.fix.startswith(fix), message


DOC = """\
top: 1
scrape:
  timeout: soon
  retries: 3
  enabled: maybe
  flag:
list: [1]
"""


def test_a_mapping_records_every_problem_with_its_line_and_path_and_reads_on():
    doc = load_documents(DOC, "c.yaml")[0]
    root = Fields("c.yaml", "", doc)
    scrape = root.child("scrape")
    assert scrape.get("timeout", fields.duration, 5) == 5  # refused: the default, and a problem
    assert scrape.get("retries", fields.positive_int, 1) == 3
    assert scrape.get("enabled", fields.boolean, True) is True
    assert scrape.get("flag", fields.boolean, True) is True  # null: absent
    assert scrape.get("missing", fields.boolean, False) is False
    root.check_keys(("top", "scrape"))
    root.child("list")
    assert [str(p) for p in root.problems] == [
        "c.yaml:3: field scrape.timeout: 'soon' is not a duration (fix: write e.g. 10m)",
        "c.yaml:5: field scrape.enabled: expected true or false, got 'maybe' (fix: write true or false)",
        "c.yaml:7: field list: unknown setting (fix: remove it or correct the name (known keys: top, scrape))",
        "c.yaml:7: field list: expected a mapping, got LineList (fix: write key: value pairs here)",
    ]
    assert root.problems[0] == Problem("c.yaml", "'soon' is not a duration", "scrape.timeout", 3, "write e.g. 10m")


def test_a_reader_that_refuses_null_says_so():
    class Strict(Fields):
        NULL_IS_ABSENT = False

    node = Strict("f.yaml", "pool", load_documents("per_replica:\n", "f.yaml")[0])
    assert node.get("per_replica", fields.number(0.1), 1.0) == 1.0
    assert [str(p) for p in node.problems] == [
        "f.yaml:1: field pool.per_replica: expected a number at least 0.1, got None (fix: write a number at least 0.1)"]


@pytest.mark.parametrize("module", ["slogen/loaders/common.py", "slogen/autoscaling.py", "slogen/thresholds.py",
                                    "exporter/config.py", "llmslo/sli_plugins.py"])
def test_every_input_format_reads_its_fields_through_the_one_reader(module):
    tree = ast.parse((REPO / module).read_text())
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("llmslo", "fields") in imported, module
    # no reader of its own: the bool-is-not-a-number test is written once, in llmslo/fields.py
    assert "isinstance(value, bool) or not isinstance(value, (int, float))" not in (REPO / module).read_text()
