"""How sure a comparison is: repeats of one configuration summarised by n, mean, standard
deviation and a 95% Student-t confidence interval of the mean, and two configurations told apart
by Welch's t-test (unequal variances) at the 5% level. On a shared machine whose throughput moves
20-30% between runs, a difference smaller than that noise is reported as a tie, not a ranking."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Iterable, Optional

from scipy.stats import t as student_t
from scipy.stats import ttest_ind

ALPHA = 0.05  # two-sided significance level of every verdict
CONFIDENCE = 1 - ALPHA  # and the level of every interval (95%)
TEST_NAME = "Welch's t-test at 5%"


@dataclass(frozen=True)
class Summary:
    """The repeats' values of one metric. `lo`/`hi` (the 95% interval of the mean) are None for
    n < 2: one run says nothing about the noise."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> Optional[float]:
        return sum(self.values) / self.n if self.values else None

    @property
    def sd(self) -> Optional[float]:
        if self.n < 2:
            return None
        if len(set(self.values)) == 1:
            return (
                0.0  # exactly: the float mean of equal values can differ from them in the last bit
            )
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.n - 1))

    @property
    def half_width(self) -> Optional[float]:
        """Half the width of the 95% Student-t interval of the mean (t with n - 1 degrees of freedom)."""
        if self.n < 2:
            return None

        return float(student_t.ppf(1 - ALPHA / 2, self.n - 1)) * self.sd / math.sqrt(self.n)

    @property
    def lo(self) -> Optional[float]:
        h = self.half_width
        return None if h is None else self.mean - h

    @property
    def hi(self) -> Optional[float]:
        h = self.half_width
        return None if h is None else self.mean + h

    def text(self, spec: str = ".3g", unit: str = "") -> str:
        """'0.612 ± 0.081 s' (the ± is the interval's half-width); one run: '0.612 s'; none: '-'."""
        if not self.values:
            return "-"
        h = self.half_width
        value = format(self.mean, spec)
        return f"{value} ± {format(h, spec)}{unit}" if h is not None else f"{value}{unit}"


def summarize(values: Iterable[Optional[float]]) -> Summary:
    """The finite values among `values` (a missing metric or a NaN is not a measurement)."""
    return Summary(tuple(float(v) for v in values if v is not None and math.isfinite(float(v))))


# Outcomes of `compare_means(a, b)`.
LESS, GREATER, TIED, UNTESTED = "less", "greater", "tied", "untested"


def welch_p(a: Summary, b: Summary) -> Optional[float]:
    """Two-sided p-value of Welch's t-test for equal means; None when either side has fewer than
    two values (no variance to test against)."""
    if a.n < 2 or b.n < 2:
        return None
    if a.sd == 0 and b.sd == 0:
        # No noise at all (a deterministic metric): any difference is real, none is a tie.
        return 1.0 if a.mean == b.mean else 0.0

    with warnings.catch_warnings():
        # scipy warns of precision loss for nearly equal values; the p-value is still the answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_ind(a.values, b.values, equal_var=False).pvalue)
    return 1.0 if p != p else p  # NaN: no spread to tell them apart


def compare_means(a: Summary, b: Summary, alpha: float = ALPHA) -> str:
    """LESS or GREATER when a's mean is significantly below or above b's; TIED when the
    difference is within the noise; UNTESTED when a side has n < 2."""
    p = welch_p(a, b)
    if p is None:
        return UNTESTED
    if p >= alpha:
        return TIED
    return LESS if a.mean < b.mean else GREATER


def tied_with_best(
    groups: dict[str, Summary], lower_is_better: bool
) -> tuple[Optional[str], list[str], list[str]]:
    """The best group by mean, the groups tied with it (Welch, not significantly different), and
    those that could not be tested against it (n < 2 on either side). Groups without values are
    left out."""
    measured = {k: s for k, s in groups.items() if s.n}
    if not measured:
        return None, [], []
    sign = 1 if lower_is_better else -1
    best = min(measured, key=lambda k: sign * measured[k].mean)
    tied, untested = [], []
    for key, summary in sorted(measured.items(), key=lambda kv: sign * kv[1].mean):
        if key == best:
            continue
        outcome = compare_means(summary, measured[best])
        if outcome == TIED:
            tied.append(key)
        elif outcome == UNTESTED:
            untested.append(key)
    return best, tied, untested
