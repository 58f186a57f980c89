"""slogen/gofmt.py: go_quote writes strconv.Quote's text for label values, escaped or not (its fast path for
text with nothing to escape must agree with the escaping one)."""

from __future__ import annotations

import pytest

from slogen.gofmt import go_quote, label_filter


@pytest.mark.parametrize(("text", "quoted"), [
    ("", '""'),
    ("plain-value_1.2", '"plain-value_1.2"'),
    ("é 中 {a=b}, [5m]", '"é 中 {a=b}, [5m]"'),  # printable UTF-8 and PromQL punctuation stay as they are
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("a\nb\tc\rd", '"a\\nb\\tc\\rd"'),
    ("nul\x00 us\x1f del\x7f", '"nul\\x00 us\\x1f del\\x7f"'),
])
def test_go_quote_is_strconv_quote(text, quoted):
    assert go_quote(text) == quoted


def test_label_filter_sorts_keys_and_quotes_values():
    assert label_filter({"b": 'x"y', "a": "1"}) == '{a="1", b="x\\"y"}'
