"""Kubernetes resource quantities (`500m`, `1.5Gi`, `1e3`) as exact fractions.

Owns `parse_quantity`, apimachinery's `ParseQuantity` (`pkg/api/resource/quantity.go` and
`suffix.go`), the two readers kubelet's downward API uses on a quantity: `value`
(`Quantity.Value()`) and `milli_value` (`Quantity.MilliValue()`), both rounded up, away from zero,
and `canonical`, `Quantity.String()`: the form the API server stores and compares divisors in.

`parse_quantity` accepts what `ParseQuantity` accepts, odd corners included, because the API server
stored whatever it accepted: decimal suffixes `n u m "" k M G T P E`, binary `Ki`..`Ei`, and
exponents `e<n>`/`E<n>` (a lone `E` is exa, a lone `e` is an error); `1.`, `.5` and even `.`, `+`,
`e3` or `Ki` (all zero, since the scanner supplies a missing number as 0); an exponent that
overflows int32 wraps, as Go's `int32(parsed)` does. Values are rounded up to a multiple of 1e-9
(`0.1n` is `1n`) and capped at 2^63-1, as the scanner's slow path does.

Deliberate differences, neither reachable from a quantity the API server would put in a pod:
- a negative quantity is an error (the API server refuses negative resources; divisors are fixed);
- past int64, `value`/`milli_value` saturate at 2^63-1 as current apimachinery does, where older
  releases wrapped around or returned 0 depending on which internal form the value had.

Excludes: quantity arithmetic, and the API server's list of allowed divisors
(`fusevol.decode.volume_sources`).
"""

from __future__ import annotations

import decimal
import json
import math
from dataclasses import dataclass
from fractions import Fraction

MAX_INT64 = 2**63 - 1

_NANO = 10**9
_DIGITS = frozenset("0123456789")
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DECIMAL_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_NAMES = {exponent: suffix for suffix, exponent in _DECIMAL_SUFFIXES.items()}
_BINARY_NAMES = {exponent: suffix for suffix, exponent in _BINARY_SUFFIXES.items()}

# apimachinery's error texts.
_FORMAT_WRONG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_NUMERIC = "unable to parse numeric part of quantity"
_SUFFIX = "unable to parse quantity's suffix"
_NEGATIVE = "must be greater than or equal to 0"


def parse_quantity(text: str) -> Fraction:
    """The exact value of quantity `text`; `ValueError` (quoting `text`) if it is not one."""
    if not text:
        raise _invalid(text, _FORMAT_WRONG)
    if text == "0":
        return Fraction(0)
    scanned = _scan(text)
    base, exponent = _interpret(text, scanned.suffix)
    if _slow_path(scanned, base=base, exponent=exponent) and not _DIGITS & set(scanned.number):
        # The slow path hands `number` to inf.Dec's SetString, which wants at least one digit.
        raise _invalid(text, _NUMERIC)
    magnitude = _magnitude(scanned, base=base, exponent=exponent)
    if scanned.negative and magnitude:
        raise _invalid(text, _NEGATIVE)
    return magnitude


def value(quantity: Fraction) -> int:
    """`Quantity.Value()`: rounded up away from zero, saturated to int64."""
    return _saturate(_away_from_zero(quantity))


def milli_value(quantity: Fraction) -> int:
    """`Quantity.MilliValue()`: `quantity * 1000` rounded up away from zero, saturated to int64."""
    return _saturate(_away_from_zero(quantity * 1000))


def canonical(text: str) -> str:
    """`Quantity.String()` of `text` (`CanonicalizeBytes`): the form the API server stores.

    The format is the suffix's: binary (`Ki`..`Ei`) stays binary for a whole number of at least
    1024, as the largest power of 1024 that divides it (`1024Ki` is `1Mi`, `1536Ki` is `1536Ki`);
    otherwise decimal, with the largest exponent that is a multiple of 3 and leaves an integer
    mantissa, written as an SI suffix (`1000m` is `1`, `1500` is `1500`, `0.001` is `1m`) or, when
    `text` had an `e` exponent, as one (`1000e0` is `1e3`). Zero is `0` however written. An exponent
    past the suffix table gets no suffix at all, as apimachinery writes it (unreachable from a
    value below 2^63, where parsing saturates).
    """
    amount = parse_quantity(text)
    if not amount:
        return "0"
    suffix = _scan(text).suffix
    if suffix in _BINARY_SUFFIXES and amount >= 1024 and amount.denominator == 1:
        mantissa, power = int(amount), 0
        while mantissa % 1024 == 0:
            mantissa, power = mantissa // 1024, power + 10
        return f"{mantissa}{_BINARY_NAMES.get(power, '')}"
    mantissa, power = int(amount * _NANO), -9  # parsing rounded it to a whole number of nanos
    while mantissa % 10 == 0:
        mantissa, power = mantissa // 10, power + 1
    mantissa, power = mantissa * 10 ** (power % 3), power - power % 3
    if suffix and suffix not in _DECIMAL_SUFFIXES and suffix not in _BINARY_SUFFIXES:
        return f"{mantissa}e{power}" if power else str(mantissa)
    return f"{mantissa}{_DECIMAL_NAMES.get(power, '')}"


# -- the scanner -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Scanned:
    """`parseQuantityString`'s results."""

    negative: bool
    number: str
    """Sign, digits and point as written (Go's `value`): what the slow path parses."""
    whole: str
    """Digits before the point without leading zeros; "0" when there are none."""
    fraction: str
    """Digits after the point."""
    suffix: str


def _scan(text: str) -> _Scanned:
    """`parseQuantityString`: split into sign, number and suffix, or fail on the shape."""
    end = len(text)
    negative = text[0] == "-"
    pos = 1 if text[0] in "+-" else 0
    while pos < end and text[pos] == "0":
        pos += 1
    if pos == end:  # only a sign and zeros
        return _Scanned(negative, "0", "0", "", "")
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    whole = text[start:pos] or "0"
    fraction = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        fraction = text[start:pos]
    number = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise _invalid(text, _FORMAT_WRONG)
    return _Scanned(negative, number, whole, fraction, text[suffix_start:])


def _interpret(text: str, suffix: str) -> tuple[int, int]:
    """`suffixHandler.interpret`: (base, exponent) of `suffix`."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix]
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix]
    if len(suffix) > 1 and suffix[0] in "eE":
        exponent = _parse_int64(suffix[1:])
        if exponent is None:
            raise _invalid(text, _SUFFIX)
        return 10, (exponent + 2**31) % 2**32 - 2**31  # Go's int32(parsed) wraps
    raise _invalid(text, _SUFFIX)


def _parse_int64(digits: str) -> int | None:
    """`strconv.ParseInt(digits, 10, 64)`: a sign and decimal digits only (no `_`, no spaces)."""
    body = digits[1:] if digits[:1] in ("+", "-") else digits
    if not body or not set(body) <= _DIGITS:
        return None
    number = int(decimal.Decimal(digits))
    return number if -(2**63) <= number <= MAX_INT64 else None


def _slow_path(scanned: _Scanned, *, base: int, exponent: int) -> bool:
    """Whether `ParseQuantity` leaves its int64 fast path (the result is the same either way).

    Its int64 overflow check is left out: it can only fail for numbers that have digits.
    """
    if base == 10:
        precision = 18 - (len(scanned.whole) + len(scanned.fraction))
        return precision < 0 or exponent - len(scanned.fraction) < -9
    precision = 15 - len(scanned.whole) - exponent * 3 // 10 - 1
    return bool(scanned.fraction) or precision < 0


def _magnitude(scanned: _Scanned, *, base: int, exponent: int) -> Fraction:
    """|number| * base^exponent, rounded up to a multiple of 1e-9 and capped at 2^63-1.

    Never builds a power of ten larger than the text itself: exponents can reach 2^31.
    """
    digits = (scanned.whole + scanned.fraction).lstrip("0")
    if not digits:
        return Fraction(0)
    significand = int(decimal.Decimal(digits))  # int() of a long string hits Python's limit
    if base == 2:
        if len(scanned.whole.lstrip("0")) > 19:
            return Fraction(MAX_INT64)
        exact = Fraction(significand << exponent, 10 ** len(scanned.fraction))
    else:
        power = exponent - len(scanned.fraction)
        if len(digits) - 1 + power >= 19:  # at least 10^19
            return Fraction(MAX_INT64)
        if power >= 0:
            exact = Fraction(significand * 10**power)
        elif -power - 9 >= len(digits):  # below 1e-9: rounds up to it
            return Fraction(1, _NANO)
        else:
            exact = Fraction(significand, 10**-power)
    return min(Fraction(math.ceil(exact * _NANO), _NANO), Fraction(MAX_INT64))


# -- helpers ---------------------------------------------------------------------------------------


def _away_from_zero(number: Fraction) -> int:
    return math.ceil(number) if number >= 0 else math.floor(number)


def _saturate(number: int) -> int:
    return max(-MAX_INT64 - 1, min(number, MAX_INT64))


def _invalid(text: str, reason: str) -> ValueError:
    return ValueError(f"invalid quantity {json.dumps(text, ensure_ascii=False)}: {reason}")
