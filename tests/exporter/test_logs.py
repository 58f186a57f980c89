"""One formatter for every log line of the exporter and the tap: logfmt, or JSON as an option."""

from __future__ import annotations

import json
import logging

import pytest

from exporter import logs


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(logging.getLogger(logs.TAP_LOGGER), "log", lambda level, msg: lines.append(msg))
    monkeypatch.setattr(logging.getLogger(logs.TAP_LOGGER), "isEnabledFor", lambda level: True)
    return lines


def test_logfmt_quotes_what_needs_it(captured: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(logs._format, "name", "logfmt")
    logs.event("tap_x", logger=logs.TAP_LOGGER, url="http://a/b", error='Bad "x"\nnext', empty="", n=3)
    assert captured == ['event=tap_x url=http://a/b error="Bad \\"x\\"\\nnext" empty="" n=3']


def test_json_is_one_object(captured: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(logs._format, "name", "json")
    logs.event("tap_x", logger=logs.TAP_LOGGER, url="http://a/b", n=3, e=ValueError("v"))
    assert json.loads(captured[0]) == {"event": "tap_x", "url": "http://a/b", "n": 3, "e": "v"}


def test_json_formatter_adds_time_and_level() -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, '{"event": "tap_x", "n": 1}', None, None)
    doc = json.loads(logs._JsonFormatter().format(record))
    assert doc["level"] == "WARNING" and doc["event"] == "tap_x" and doc["n"] == 1 and "ts" in doc
    plain = logging.LogRecord("x", logging.ERROR, __file__, 1, "not an event", None, None)
    assert json.loads(logs._JsonFormatter().format(plain))["msg"] == "not an event"


HOSTILE = "/v1/\x1b[2J\x1b]0;owned\x07\rok\x7f\x9b31m\x00end"  # ESC sequences, BEL, CR, DEL, C1 CSI, NUL


def _controls(line: str) -> list[str]:
    return [c for c in line if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F]


def test_logfmt_escapes_every_control_character(captured: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(logs._format, "name", "logfmt")
    logs.event("tap_x", logger=logs.TAP_LOGGER, path=HOSTILE, plain="caf\u00e9", backslash="a\\b")
    (line,) = captured
    assert _controls(line) == []
    assert line == ('event=tap_x path="/v1/\\u001b[2J\\u001b]0;owned\\u0007\\rok\\u007f\\u009b31m\\u0000end" '
                    "plain=caf\u00e9 backslash=a\\b")


def test_json_escapes_del_and_c1_too(captured: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(logs._format, "name", "json")
    logs.event("tap_x", logger=logs.TAP_LOGGER, path=HOSTILE, plain="caf\u00e9")
    (line,) = captured
    assert _controls(line) == [] and "caf\u00e9" in line
    assert json.loads(line) == {"event": "tap_x", "path": HOSTILE, "plain": "caf\u00e9"}
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "not an event " + HOSTILE, None, None)
    formatted = logs._JsonFormatter().format(record)
    assert _controls(formatted) == [] and json.loads(formatted)["msg"] == "not an event " + HOSTILE
