"""Durations, one parser per grammar, each named for it.

* Prometheus durations (`30d`, `1h30m`, `500ms`; units y w d h m s ms, whole numbers, largest first), as
  Prometheus rules, Sloth specs, Alertmanager and OpenSLO windows write them: integer milliseconds, so
  window arithmetic is exact and `format_prometheus_duration` prints what Prometheus prints (`24h` as `1d`).
* Go durations (`1.5s`, `500ms`, `1m30s`; units ns us µs ms s m h, decimals allowed), as Go programs'
  flags and exporter-toolkit's web config write them: float seconds.
"""

from __future__ import annotations

import re

MS = 1
SECOND = 1000 * MS
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WEEK = 7 * DAY
YEAR = 365 * DAY

_PROM_UNITS = (("y", YEAR), ("w", WEEK), ("d", DAY), ("h", HOUR), ("m", MINUTE), ("s", SECOND), ("ms", MS))
_PROM_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_GO_RE = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_prometheus_duration(text: str) -> int:
    """Milliseconds in a Prometheus duration such as `30d`, `1h30m`, `500ms`, or `0`; ValueError otherwise."""
    text = str(text).strip()
    if text == "0":
        return 0
    m = _PROM_RE.match(text)
    if not text or not m or not any(m.groups()):
        raise ValueError(f"not a Prometheus duration: {text!r} (expected e.g. 5m, 1h, 30d)")
    return sum(int(g) * mult for g, (_, mult) in zip(m.groups(), _PROM_UNITS, strict=True) if g)


def format_prometheus_duration(ms: int) -> str:
    """Prometheus' own spelling: years and weeks only when they divide exactly."""
    if ms == 0:
        return "0s"
    out = []
    for unit, mult in _PROM_UNITS:
        if unit in ("y", "w") and ms % mult:
            continue
        value, ms = divmod(ms, mult)
        if value:
            out.append(f"{value}{unit}")
    return "".join(out)


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration such as `1s`, `500ms`, `1m30s`, or `0`; ValueError otherwise."""
    text = str(text).strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _GO_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"{text!r} is not a Go duration (write e.g. 1s or 500ms)")
    return total
