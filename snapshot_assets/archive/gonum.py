"""Go's float formatting, which both the JSON encoding and the row-key string depend on.

laredo is written in Go, and consumers compare its output byte for byte, so the two places where
Go prints a float64 are reproduced exactly: `encoding/json` (fixed notation unless |x| < 1e-6 or
|x| >= 1e21) and `fmt`'s `%v` (exponent notation when the decimal exponent is < -4 or >= 6).
Both use the shortest digits that round-trip, which Python's `repr` also produces.
"""

from __future__ import annotations

import math


def shortest_digits(x: float) -> tuple[str, int]:
    """Return (digits, exponent) such that |x| = d.ddd × 10^exponent with the shortest round-trip digits.

    `digits` has no leading or trailing zeros (except "0" for zero); the sign is ignored.
    """
    if x == 0:
        return "0", 0
    text = repr(abs(x))
    if "e" in text or "E" in text:
        base, _, exp_part = text.lower().partition("e")
        exp = int(exp_part)
    else:
        base, exp = text, 0
    int_part, _, frac_part = base.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    # Decimal exponent of the first significant digit.
    leading_zeros = len(frac_part) - len(frac_part.lstrip("0"))
    point = len(int_part.lstrip("0")) if int_part.strip("0") else -leading_zeros
    digits = digits.rstrip("0") or "0"
    return digits, exp + point - 1


def _fixed(digits: str, exp: int) -> str:
    """Digits placed in fixed notation, no trailing `.0`."""
    if exp >= 0:
        if len(digits) <= exp + 1:
            return digits + "0" * (exp + 1 - len(digits))
        return digits[: exp + 1] + "." + digits[exp + 1 :]
    return "0." + "0" * (-exp - 1) + digits


def _exponent(digits: str, exp: int) -> str:
    """Go's %e with shortest digits: `d.ddde±XX` (at least two exponent digits)."""
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    sign = "-" if exp < 0 else "+"
    return f"{mant}e{sign}{abs(exp):02d}"


def _check_finite(x: float) -> None:
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"unsupported value: {x!r} (NaN and Infinity have no JSON encoding)")


def go_json_float(x: float) -> str:
    """Format a float64 exactly as Go's encoding/json does."""
    _check_finite(x)
    sign = "-" if math.copysign(1.0, x) < 0 and x != 0 else ""
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    digits, exp = shortest_digits(x)
    a = abs(x)
    if a < 1e-6 or a >= 1e21:
        text = _exponent(digits, exp)
        # encoding/json trims a leading zero of a negative two-digit exponent: e-07 -> e-7.
        mant, _, e = text.partition("e")
        if e[0] == "-" and len(e) == 3 and e[1] == "0":
            e = "-" + e[2]
        return f"{sign}{mant}e{e}"
    return sign + _fixed(digits, exp)


def go_v_float(x: float) -> str:
    """Format a float64 exactly as Go's `fmt` `%v` does (strconv 'g', shortest)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign = "-" if x < 0 else ""
    digits, exp = shortest_digits(x)
    # strconv's 'g' with shortest precision decides with eprec = 6 whatever the digit count, so
    # 1234567.0 prints 1.234567e+06 while 123456.0 prints 123456.
    if exp < -4 or exp >= 6:
        return sign + _exponent(digits, exp)
    return sign + _fixed(digits, exp)
