"""One-line event logging for the exporter and the tap: every line through one formatter.

Operators grep and ship these lines; one event per line with key=value fields is what log
pipelines parse without configuration. `format_event` is the one place a line is written:
logfmt by default (`event=NAME key=value ...`, a value quoted and escaped when it needs it),
or one JSON object per line (`--log-format json`). Page and request contents are never passed
here, only reasons.
"""

from __future__ import annotations

import logging
import re
import sys

EXPORTER_LOGGER = "llmslo.exporter"
TAP_LOGGER = "llmslo.tap"
LOG_FORMATS = ("logfmt", "json")
_format = {"name": "logfmt"}  # what setup() chose; one per process


# C0 controls, DEL and the C1 controls (as code points): a terminal acts on them (ESC starts a sequence that can
# rewrite the screen), and a log line must show what a client sent, never let it act.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_control(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or f"\\u{ord(char):04x}"


def quote(value: object) -> str:
    """A logfmt value: as it is, or in double quotes with backslash and quote escaped and every control
    character written as an escape (`\\n`, `\\t`, `\\r`, `\\u001b`)."""
    text = str(value)
    if text == "" or any(c in text for c in ' "=') or _CONTROL.search(text):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + _CONTROL.sub(_escape_control, escaped) + '"'
    return text


def _json_line(doc: dict[str, object]) -> str:
    """One JSON object on one line, non-ASCII text kept, DEL and C1 controls escaped too (json escapes only C0)."""
    import json  # here: the default logfmt lines never need it, and `--once` starts without it

    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(doc, ensure_ascii=False))


def _json_value(value: object) -> object:
    return value if value is None or isinstance(value, (bool, int, float)) else str(value)


def format_event(name: str, fields: dict[str, object]) -> str:
    """One event's line in the chosen format (without the time and level the handler adds)."""
    if _format["name"] == "json":
        return _json_line({"event": name, **{k: _json_value(v) for k, v in fields.items()}})
    return " ".join([f"event={name}", *(f"{k}={quote(v)}" for k, v in fields.items())])


def event(name: str, level: int = logging.INFO, *, logger: str = EXPORTER_LOGGER, **fields: object) -> None:
    """Log one event as `event=NAME key=value ...` (or its JSON object)."""
    log = logging.getLogger(logger)
    if log.isEnabledFor(level):
        log.log(level, format_event(name, fields))


class _JsonFormatter(logging.Formatter):
    """`{"ts": ..., "level": ..., "event": ..., ...}`; a line that is not an event (a traceback) as `msg`."""

    def format(self, record: logging.LogRecord) -> str:
        head = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"), "level": record.levelname}
        message = record.getMessage()
        import json

        try:
            body = json.loads(message) if message.startswith("{") else None
        except ValueError:
            body = None
        doc = {**head, **(body if isinstance(body, dict) else {"msg": message})}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return _json_line(doc)


def setup(level: str = "info", logger: str = EXPORTER_LOGGER, fmt: str = "logfmt") -> None:
    """Send a logger's events to stderr with a timestamp and level (stdout carries `--once` output)."""
    _format["name"] = fmt
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    log = logging.getLogger(logger)
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False
