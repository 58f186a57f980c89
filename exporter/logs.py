"""One-line, logfmt-style event logging for the exporter.

Operators grep and ship these lines; one event per line with key=value fields is what log
pipelines parse without configuration. Page contents are never passed here, only reasons.
"""

from __future__ import annotations

import logging
import sys

_LOGGER_NAME = "llmslo.exporter"


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def event(name: str, level: int = logging.INFO, **fields: object) -> None:
    """Log one event as `event=NAME key=value ...`."""
    logger = logging.getLogger(_LOGGER_NAME)
    if not logger.isEnabledFor(level):
        return
    parts = [f"event={name}"] + [f"{k}={_quote(v)}" for k, v in fields.items()]
    logger.log(level, " ".join(parts))


def setup(level: str = "info") -> None:
    """Send exporter events to stderr with a timestamp and level prefix (stdout carries `--once` output)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    logger = logging.getLogger(_LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
