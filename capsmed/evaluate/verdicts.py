"""Was a paper's number reproduced? One verdict per table cell.

Our cell is the mean over the repetitions (seeds, folds); its 95 % interval is the
t-interval ``mean ± t(0.975, n-1) · s / √n``. The paper's number is printed rounded,
so it stands for an interval of half a unit in its last printed digit (``0.909``:
0.9085 to 0.9095; ``66``: 65.5 to 66.5). The verdict:

* **reproduced**: the two intervals overlap;
* **above** / **below**: our whole interval lies above / below the paper's number;
* **undecided**: fewer than 2 repetitions, so there is no interval to decide with, or
  a repetition's number is NaN or infinite (its interval would be NaN, which no
  comparison puts above or below the paper's number).

A paper number read from YAML loses trailing zeros (``0.970`` is read as ``0.97``), which
only widens its interval: the verdict errs towards *reproduced*, and says so. A number
with a zero as its one decimal keeps it (``76.0``: 75.95 to 76.05, not 75.5 to 76.5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
from scipy import stats

LEVEL = 0.95
WORDS = ("reproduced", "above", "below", "undecided")


@dataclass(frozen=True)
class Verdict:
    """A cell's verdict, with our interval (in the table's scale) when there is one."""

    word: str
    low: float | None = None
    high: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {"verdict": self.word, "interval": None if self.low is None
                else [self.low, self.high], "level": LEVEL}


def printed_half_unit(value: float | int) -> float:
    """Half a unit in the last digit ``value`` is printed with (0.909 -> 0.0005; 76.0,
    which YAML reads as a float, -> 0.05; 76 -> 0.5)."""
    exponent = Decimal(repr(value)).as_tuple().exponent  # normalize() would drop 76.0's 0
    return 0.5 * 10.0 ** min(0, int(exponent))


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95 % t-interval of the mean; None below 2 values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return None
    half = stats.t.ppf(0.5 + LEVEL / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def verdict(values: Sequence[float], paper: float | int, scale: float = 1.0) -> Verdict:
    """The verdict on ``paper`` (printed in the table's scale) given our ``values``."""
    if not np.isfinite(np.asarray(values, dtype=float)).all():
        return Verdict("undecided")  # a NaN interval is neither above nor below
    interval = t_interval([v * scale for v in values])
    if interval is None:
        return Verdict("undecided")
    low, high = interval
    slack = printed_half_unit(paper)
    if high < paper - slack:
        return Verdict("below", low, high)
    if low > paper + slack:
        return Verdict("above", low, high)
    return Verdict("reproduced", low, high)


def summary(verdicts: Sequence[Verdict]) -> str:
    """``3 of 4 cells reproduced (1 below)``: the verdicts of one table in a line."""
    counts = {w: sum(v.word == w for v in verdicts) for w in WORDS}
    rest = ", ".join(f"{counts[w]} {w}" for w in WORDS[1:] if counts[w])
    return (f"{counts['reproduced']} of {len(verdicts)} cells with a paper number "
            f"reproduced" + (f" ({rest})" if rest else "") + ": the paper's number (± half "
            "its last printed digit) against our mean's 95 % t-interval over the "
            "repetitions; undecided below 2 repetitions or with a NaN or infinite number")
