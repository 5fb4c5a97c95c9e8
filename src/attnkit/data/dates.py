"""A built-in translation task whose alignments are easy to see: dates written many ways -> ISO 8601.

``"Tuesday, March 4th 1997"`` -> ``"1997-03-04"``. Generated from a seed, so no download is needed.
"""

from __future__ import annotations

import datetime as dt
import random

from attnkit.data.corpus import Parallel

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


FORMATS = [
    lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{DAYS[d.weekday()]}, {MONTHS[d.month - 1]} {_ordinal(d.day)} {d.year}",
    lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",
    lambda d: f"{d.month}/{d.day}/{d.year % 100:02d}",
    lambda d: f"{MONTHS[d.month - 1][:3]} {d.day} {d.year}",
    lambda d: f"{d.day}.{d.month}.{d.year}",
    lambda d: f"the {_ordinal(d.day)} of {MONTHS[d.month - 1]}, {d.year}",
    lambda d: f"{DAYS[d.weekday()][:3]} {d.day} {MONTHS[d.month - 1][:3].upper()} {d.year}",
    lambda d: f"{d.year}/{d.month}/{d.day}",
]


def random_date(rng: random.Random) -> dt.date:
    start = dt.date(1950, 1, 1).toordinal()
    return dt.date.fromordinal(rng.randrange(start, dt.date(2049, 12, 31).toordinal()))


def generate_dates(n: int, seed: int = 0) -> Parallel:
    """``n`` pairs (human-written date, ISO date). For two-digit years the century is ambiguous,
    so format 4 is only used for dates between 1950 and 2049, which is the whole range."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        d = random_date(rng)
        src.append(rng.choice(FORMATS)(d))
        tgt.append(d.isoformat())
    return Parallel(src, tgt, f"dates(n={n}, seed={seed})")
