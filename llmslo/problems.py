"""The one way every input problem is written: `FILE:LINE: [SLO 'x': ][field F: ]what is wrong (fix: what to write)`.

SLO specs (slogen), autoscaling specs, the spec file reader and the exporter's config and web config files all
report through `describe`, so an operator learns one shape of message, and an editor or CI log parser can jump
to FILE:LINE from any of them.
"""

from __future__ import annotations


def describe(file: str, message: str, *, line: int | None = None, field: str = "", slo: str = "", fix: str = "") -> str:
    parts = [file + (f":{line}" if line else "")]
    if slo:
        parts.append(f"SLO {slo!r}")
    if field:
        parts.append(f"field {field}")
    text = ": ".join(parts) + f": {message}"
    return text + (f" (fix: {fix})" if fix else "")
