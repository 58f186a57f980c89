"""slogen's fast YAML writer (slogen.yamlfast) writes exactly PyYAML's bytes, or steps aside.

Random trees over YAML's awkward characters (indicators, quotes, line breaks of every kind, values the
resolver reads as other types) through `slogen.yamlio.dump` and through PyYAML's pure-Python emitter.
Cost: about 4,000 small documents, under 2 s.
"""

from __future__ import annotations

import random

import yaml

from slogen import yamlfast, yamlio

ALPHABET = list("abyYnNtTfFoO0123456789 :#-?{}[],&*!|>'\"%@`\\.=~+$()/_<\t\r") + [
    "\n", "\n\n", " \n", "\n ", "---", "...", "<<", "null", "true", "1e3", "0x1f", "1_0", "1:20", "2024-01-01",
    ".inf", "~", "\u00e9", "\u2028", "\x85", "\ufeff", "\x7f", "\U0001F600", "{{ $labels.x }}",
]


def _tree(rng: random.Random, depth: int = 0):
    k = rng.random()
    if depth > 3 or k < 0.45:
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 7)))
        return rng.choice([text, text, text, rng.randint(-5, 10**6), rng.random() * 10 ** rng.randint(-6, 20),
                           True, None, 1e17])
    if k < 0.8:
        return {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 5))): _tree(rng, depth + 1)
                for _ in range(rng.randint(0, 4))}
    return [_tree(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def _pyyaml(obj) -> str:
    return yaml.dump(obj, Dumper=yamlio._Dumper, **yamlio._OPTIONS)


def test_dump_writes_pyyamls_bytes_whichever_writer_takes_it() -> None:
    rng = random.Random(16)
    fast = 0
    for _ in range(4000):
        obj = _tree(rng)
        if not isinstance(obj, (dict, list)):
            continue
        fast += yamlfast.write(obj, _pyyaml) is not None
        assert yamlio.dump(obj) == _pyyaml(obj), repr(obj)
    assert fast > 300  # the fast writer took a good share (439 of these), not none by mistake


def test_a_rule_file_is_written_by_the_fast_writer() -> None:
    rule = {"groups": [{"name": "g", "rules": [
        {"record": "slo:sli_error:ratio_rate5m", "expr": 'sum(rate(x{code=~"5.."}[5m]))\n/\nsum(rate(x[5m]))\n',
         "labels": {"sloth_id": "svc-slo", "sloth_window": "5m"}},
        {"alert": "Burn", "expr": "(x > (14.4 * 0.001))", "for": "2m", "labels": {"severity": "page"},
         "annotations": {"summary": "svc: 'slo' burns", "runbook_url": "https://x/docs/runbooks/Burn.md"}}]}]}
    text = yamlfast.write(rule, _pyyaml)
    assert text is not None and text == _pyyaml(rule)


def test_a_mapping_written_again_is_the_same_text_at_each_place() -> None:
    """One object listed many times (the generated tests' expected alerts, shared by every step they fire at)
    is written in full at each place, at that place's indentation: PyYAML's bytes, no anchors."""
    alert = {"exp_labels": {"alertname": "Burn", "severity": "page"}, "exp_annotations": {"summary": "x: 'y'"}}
    other = {"exp_labels": {"alertname": "Burn", "severity": "ticket"}}
    doc = {"tests": [{"alert_rule_test": [{"eval_time": f"{k}m", "exp_alerts": [alert, other, alert]} for k in range(3)]},
                     {"nested": {"deeper": [alert, {"k": [alert]}]}}, alert]}
    text = yamlfast.write(doc, _pyyaml)
    assert text is not None and text == _pyyaml(doc) and "&" not in text
    rng = random.Random(7)
    for _ in range(300):  # random trees with shared subtrees at different depths
        shared = _tree(rng, 2)
        obj = [shared, {"a": [shared, {"b": shared}]}, shared] if isinstance(shared, dict) else [{"x": shared}]
        assert yamlio.dump(obj) == _pyyaml(obj), repr(obj)
