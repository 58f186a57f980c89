"""Number and string formatting as Go prints it, so `--sloth-compat` output matches Sloth's.

Sloth renders floats with `%g`/`%v` (shortest round-trip digits; exponent form when the
decimal exponent is < -4 or >= 6) and `strconv.FormatFloat(f, 'f', -1, 64)`. Python's repr()
yields the same shortest digits; only the layout differs.
"""

from __future__ import annotations

from decimal import Decimal


def _digits(x: float) -> tuple[str, int]:
    """Shortest round-trip digits of |x| and the decimal point position (as strconv's decimal)."""
    sign, digits, exp = Decimal(repr(abs(x))).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    # value = 0.ds * 10**dp
    dp = len(digits) + exp
    if ds == "0":
        dp = 0
    return ds, dp


def go_f(x: float) -> str:
    """strconv.FormatFloat(x, 'f', -1, 64)."""
    if x == int(x) and abs(x) < 1e16:
        return str(int(x))
    ds, dp = _digits(x)
    sign = "-" if x < 0 else ""
    if dp <= 0:
        return f"{sign}0.{'0' * -dp}{ds}"
    if dp >= len(ds):
        return sign + ds + "0" * (dp - len(ds))
    return f"{sign}{ds[:dp]}.{ds[dp:]}"


def go_g(x: float) -> str:
    """fmt's %v / %g for a float64 with shortest precision (exponent when exp < -4 or exp >= 6)."""
    if x == 0:
        return "0"
    ds, dp = _digits(x)
    exp = dp - 1
    if exp < -4 or exp >= 6:
        sign = "-" if x < 0 else ""
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        esign = "-" if exp < 0 else "+"
        return f"{sign}{mant}e{esign}{abs(exp):02d}"
    return go_f(x)


def go_quote(s: str) -> str:
    """strconv.Quote for the label values we meet (printable ASCII and UTF-8 text)."""
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def label_filter(labels: dict[str, str]) -> str:
    """prometheus/common LabelSet.String(): `{a="1", b="2"}`, keys sorted."""
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in sorted(labels.items())) + "}"
