"""The metric names a PromQL expression reads, with the job each selector names: a simple
extraction, enough for the chart's alerts and dashboard, not a PromQL parser.

An expression is read as a sequence of tokens, left to right:

1. a quoted string ("...", '...', `...`), a range or subquery (`[5m]`, `[$__rate_interval]`), a
   grouping clause (`by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left
   (...)`, `group_right (...)`) and a number (`0.99`, `1e6`, `5m` after `offset`) are skipped;
2. an identifier followed by `(` is a function or an aggregation (`rate(`, `sum(`), and an
   identifier that is a PromQL keyword or aggregation (`sum by`, `and`, `bool`) is no name;
3. any other identifier is a metric name, and a `{...}` right after it is its selector, from
   which the `job` matcher (`job="..."`) is taken ("" if it has none).

So `histogram_quantile(0.99, sum by (le) (rate(x_bucket{job="a"}[5m])))` reads `x_bucket` of
job `a`. A name is what the exposition shows: a histogram's `_bucket`, `_sum` and `_count`, a
counter's `_total` (`exposed_names` maps a scraped family to them). An expression must not hide
a metric name in a string (`label_replace`'s arguments are skipped) or select by `__name__`: the
chart's do neither, and `names` raises on a bare selector (`{job="a"}`, no name).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prometheus_client.metrics_core import Metric

_TOKEN = re.compile(
    r"""
      (?P<skip>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`
        |\[[^\]]*\]
        |\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)
        |\b\d[\w.]*)
    | (?P<name>[A-Za-z_:][\w:]*)(?:\s*(?P<call>\()|\s*(?P<selector>\{[^}]*\}))?
    | (?P<bare>\{[^}]*\})
    """,
    re.X,
)
_KEYWORDS = frozenset(
    {
        *("and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"),
        *("by", "without", "on", "ignoring", "group_left", "group_right"),
        *("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"),
        *("bottomk", "topk", "quantile"),
    }
)
_JOB = re.compile(r"""\bjob\s*=\s*"([^"]*)\"""")


def names(expr: str) -> set[tuple[str, str]]:
    """The (metric name, job) pairs `expr` selects (the module docstring's steps)."""
    found: set[tuple[str, str]] = set()
    for match in _TOKEN.finditer(expr):
        if match["bare"]:
            raise ValueError(f"a selector without a metric name in {expr!r}")
        name = match["name"]
        if name is None or match["call"] or name in _KEYWORDS:  # (1), (2)
            continue
        job = _JOB.search(match["selector"] or "")  # (3)
        found.add((name, job[1] if job else ""))
    return found


def exposed_names(families: Iterable[Metric]) -> set[str]:
    """Every name a query may use for the scraped `families`: each sample's, and those the
    family declares without a sample yet (a labelled counter or histogram nobody moved)."""
    out: set[str] = set()
    for family in families:
        out.update(sample.name for sample in family.samples)
        if family.type == "counter":
            out.add(f"{family.name}_total")
        elif family.type == "histogram":
            out.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            out.add(family.name)
    return out
