"""Quantities: apimachinery's `ParseQuantity`, `Value()` and `MilliValue()`, table-driven."""

from __future__ import annotations

from fractions import Fraction

import pytest

from fusevol.base.quantity import MAX_INT64, milli_value, parse_quantity, value

NANO = Fraction(1, 10**9)

PARSES = [
    pytest.param("0", Fraction(0), id="zero"),
    pytest.param("500m", Fraction(1, 2), id="milli"),
    pytest.param("250m", Fraction(1, 4), id="milli-quarter"),
    pytest.param("1.5", Fraction(3, 2), id="decimal-point"),
    pytest.param("1", Fraction(1), id="one"),
    pytest.param("100n", Fraction(1, 10**7), id="nano"),
    pytest.param("3u", Fraction(3, 10**6), id="micro"),
    pytest.param("1k", Fraction(1000), id="kilo"),
    pytest.param("1M", Fraction(10**6), id="mega"),
    pytest.param("1G", Fraction(10**9), id="giga"),
    pytest.param("1T", Fraction(10**12), id="tera"),
    pytest.param("1P", Fraction(10**15), id="peta"),
    pytest.param("1E", Fraction(10**18), id="capital-E-alone-is-exa"),
    pytest.param("2Ki", Fraction(2048), id="kibi"),
    pytest.param("1Mi", Fraction(2**20), id="mebi"),
    pytest.param("1.5Mi", Fraction(3 * 2**19), id="mebi-fraction"),
    pytest.param("1Gi", Fraction(2**30), id="gibi"),
    pytest.param("1Ti", Fraction(2**40), id="tebi"),
    pytest.param("1Pi", Fraction(2**50), id="pebi"),
    pytest.param("1Ei", Fraction(2**60), id="exbi"),
    pytest.param("0.1Ki", Fraction(1024, 10), id="binary-with-fraction"),
    pytest.param("1e3", Fraction(1000), id="exponent"),
    pytest.param("1E3", Fraction(1000), id="capital-E-with-digits-is-an-exponent"),
    pytest.param("1e+3", Fraction(1000), id="exponent-plus"),
    pytest.param("15e-1", Fraction(3, 2), id="exponent-minus"),
    pytest.param("+1", Fraction(1), id="plus-sign"),
    pytest.param("007", Fraction(7), id="leading-zeros"),
    pytest.param("1.", Fraction(1), id="trailing-point"),
    pytest.param(".5", Fraction(1, 2), id="leading-point"),
    pytest.param("1.G", Fraction(10**9), id="point-before-suffix"),
    pytest.param("-0", Fraction(0), id="negative-zero"),
    pytest.param("-0.0m", Fraction(0), id="negative-zero-milli"),
    pytest.param(".", Fraction(0), id="point-alone-is-zero"),
    pytest.param("+", Fraction(0), id="sign-alone-is-zero"),
    pytest.param("e3", Fraction(0), id="exponent-without-number-is-zero"),
    pytest.param("Ki", Fraction(0), id="suffix-without-number-is-zero"),
    pytest.param("0e-10", Fraction(0), id="zero-small-exponent"),
    pytest.param("0.1n", NANO, id="below-nano-rounds-up"),
    pytest.param("1.0000000001", 1 + NANO, id="tenth-digit-rounds-up"),
    pytest.param("1e-1000000000", NANO, id="tiny-rounds-up-to-nano"),
    pytest.param("1e4294967296", Fraction(1), id="exponent-wraps-like-int32"),
    pytest.param("9223372036854775807", Fraction(MAX_INT64), id="max-int64"),
    pytest.param("9223372036854775808", Fraction(MAX_INT64), id="capped-at-max-int64"),
    pytest.param("1e1000", Fraction(MAX_INT64), id="huge-exponent-capped"),
    pytest.param("100000Ei", Fraction(MAX_INT64), id="huge-binary-capped"),
    pytest.param("0." + "0" * 5000 + "1", NANO, id="five-thousand-digits"),
]


@pytest.mark.parametrize(("text", "expected"), PARSES)
def test_parse(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


FORMAT = "quantities must match the regular expression"
SUFFIX = "unable to parse quantity's suffix"
NUMERIC = "unable to parse numeric part of quantity"

ERRORS = [
    pytest.param("", FORMAT, id="empty"),
    pytest.param("1e", SUFFIX, id="lower-e-alone"),
    pytest.param("1i", SUFFIX, id="i-alone"),
    pytest.param("0.1mi", SUFFIX, id="milli-i"),
    pytest.param("1KB", FORMAT, id="not-a-suffix-letter"),
    pytest.param("1ki", SUFFIX, id="lower-kibi"),
    pytest.param("1e-", SUFFIX, id="exponent-sign-only"),
    pytest.param("1ee3", SUFFIX, id="exponent-not-a-number"),
    pytest.param("1e99999999999999999999", SUFFIX, id="exponent-beyond-int64"),
    pytest.param("1.1.1", FORMAT, id="two-points"),
    pytest.param(" 1", FORMAT, id="leading-space"),
    pytest.param("1 ", FORMAT, id="trailing-space"),
    pytest.param("1e3k", FORMAT, id="letters-after-exponent"),
    pytest.param("abc", FORMAT, id="letters"),
    pytest.param("１", FORMAT, id="non-ascii-digit"),
    pytest.param(".e-10", NUMERIC, id="no-digit-slow-path"),
    pytest.param("Pi", NUMERIC, id="no-digit-binary-slow-path"),
    pytest.param("-1", "must be greater than or equal to 0", id="negative"),
    pytest.param("-0.0000000001", "must be greater than or equal to 0", id="negative-tiny"),
]


@pytest.mark.parametrize(("text", "reason"), ERRORS)
def test_parse_error(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=r"^invalid quantity ") as info:
        parse_quantity(text)
    message = str(info.value)
    assert f'"{text}": {reason}' in message


VALUES = [
    pytest.param("0", 0, 0, id="zero"),
    pytest.param("250m", 1, 250, id="quarter-core"),
    pytest.param("1m", 1, 1, id="one-milli"),
    pytest.param("1.5", 2, 1500, id="one-and-a-half"),
    pytest.param("1n", 1, 1, id="nano-rounds-up-twice"),
    pytest.param("1001u", 1, 2, id="micro-rounds-up-to-milli"),
    pytest.param("1.5Mi", 1572864, 1572864000, id="binary"),
    pytest.param("1Ei", 2**60, MAX_INT64, id="milli-saturates"),
    pytest.param("9223372036854775807", MAX_INT64, MAX_INT64, id="max"),
]


@pytest.mark.parametrize(("text", "expected_value", "expected_milli"), VALUES)
def test_value_and_milli_value(text: str, expected_value: int, expected_milli: int) -> None:
    q = parse_quantity(text)
    assert (value(q), milli_value(q)) == (expected_value, expected_milli)


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        pytest.param(Fraction(-3, 2), -2, id="negative-away-from-zero"),
        pytest.param(Fraction(-(2**70)), -(2**63), id="negative-saturates"),
        pytest.param(Fraction(2**70), MAX_INT64, id="positive-saturates"),
    ],
)
def test_value_of_any_fraction(number: Fraction, expected: int) -> None:
    assert value(number) == expected
