"""Off-peak pricing: windows of the week, in the cluster's time zone, in which a GPU-hour is
charged at a fraction (``factor``) of its price.

A window is written ``"<days> <HH:MM>-<HH:MM>"`` in local wall-clock time: ``"Mon-Fri
20:00-07:00"`` (each weekday evening until seven the next morning: a window whose end is not
after its start runs past midnight), ``"Sat-Sun 00:00-24:00"`` (the whole weekend), ``"Sun
22:00-24:00"``, ``"Mon,Wed 12:00-14:00"``. Days: Mon Tue Wed Thu Fri Sat Sun, a range
``Mon-Fri`` (a range may wrap: ``Fri-Mon``) or a comma-separated list of either. Windows that
overlap or touch are one window.

Edges are local wall-clock times, so on a daylight-saving change day a night window is an hour
shorter or longer in real time. A local time that does not exist (the hour skipped in spring)
is read as the moment the clock jumps; one that occurs twice (in autumn) as its first
occurrence.

Pure: ``zoneinfo`` reads the time zone rules (the IANA database), nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .yamlnodes import Node

DAYS: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WINDOW = re.compile(r"^\s*(?P<days>[A-Za-z,\- ]+?)\s+(?P<h1>\d{1,2}):(?P<m1>\d{2})\s*-\s*"
                     r"(?P<h2>\d{1,2}):(?P<m2>\d{2})\s*$")
#: how far ahead :meth:`OffPeak.next_start` looks (a week holds every window at least once)
_LOOKAHEAD_DAYS = 8


@dataclass(frozen=True, slots=True)
class Window:
    """One weekly window: starts on each of ``days`` (0 = Monday) at ``start`` minutes after
    local midnight, ends ``end`` minutes after that day's midnight (``end`` > 1440: the next
    day; a window ``20:00-07:00`` has start 1200, end 1860)."""

    days: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class OffPeak:
    """The off-peak policy: ``windows`` in ``timezone`` charged at ``factor`` (0 ≤ factor <
    1). ``text`` keeps the windows as the admin wrote them (for messages and reports)."""

    timezone: str
    factor: float
    windows: tuple[Window, ...]
    text: tuple[str, ...] = ()

    # ------------------------------------------------------------ the price
    def factor_at(self, t: float) -> float:
        """The price factor at instant ``t`` (UNIX seconds): ``factor`` inside a window, else 1."""
        for s, e in _edges(self, t - 2 * 86400.0, t + 1.0):
            if s <= t < e:
                return self.factor
        return 1.0

    def next_start(self, t: float) -> float | None:
        """The first instant at or after ``t`` charged at ``factor``: ``t`` itself inside a
        window, else the next window's start (None: no window in the coming week)."""
        for s, e in _edges(self, t - 2 * 86400.0, t + _LOOKAHEAD_DAYS * 86400.0):
            if e > t:
                return max(s, t)
        return None

    def split(self, a: float, b: float) -> list[tuple[float, float, float]]:
        """``[a, b)`` cut at the windows' edges: ``(start, end, factor)`` parts, in order,
        contiguous, covering exactly ``[a, b)`` (none when ``b <= a``)."""
        if b <= a:
            return []
        out: list[tuple[float, float, float]] = []
        at = a
        for s, e in _edges(self, a, b):
            if e <= at or s >= b:
                continue
            if s > at:
                out.append((at, s, 1.0))
                at = s
            end = min(e, b)
            out.append((at, end, self.factor))
            at = end
        if at < b:
            out.append((at, b, 1.0))
        return out

    def weighted_seconds(self, a: float, b: float) -> float:
        """Seconds of ``[a, b)`` each weighted by its price factor."""
        return sum((e - s) * f for s, e, f in self.split(a, b))


def weighted_seconds(off_peak: OffPeak | None, a: float, b: float) -> float:
    """Seconds of ``[a, b)`` at their price (plain ``b - a`` with no off-peak policy)."""
    if b <= a:
        return 0.0
    if off_peak is None:
        return b - a
    return off_peak.weighted_seconds(a, b)


_WEEK = 7 * 86400.0
#: per policy: the first week counted (UNIX seconds // week) and the priced clock at the start
#: of it and of each following week (a memo: the same figures as computed from scratch)
_WEEKS: dict[OffPeak, tuple[int, list[float]]] = {}


def priced_clock(off_peak: OffPeak | None, t: float) -> float:
    """A clock that runs at the price: ``priced_clock(p, b) - priced_clock(p, a)`` is
    ``weighted_seconds(p, a, b)`` for any ``a <= b``, so a sum of intervals' priced lengths
    can be kept incrementally (sim/fastmeter.py). ``t`` itself with no policy."""
    if off_peak is None:
        return t
    k = int(t // _WEEK)
    base, cum = _WEEKS.setdefault(off_peak, (k, [0.0]))
    while k < base:
        base -= 1
        cum.insert(0, cum[0] - off_peak.weighted_seconds(base * _WEEK, (base + 1) * _WEEK))
    while k >= base + len(cum):
        i = base + len(cum) - 1
        cum.append(cum[-1] + off_peak.weighted_seconds(i * _WEEK, (i + 1) * _WEEK))
    _WEEKS[off_peak] = (base, cum)
    return cum[k - base] + off_peak.weighted_seconds(k * _WEEK, t)


def describe_start(off_peak: OffPeak, t: float) -> dict:
    """What the quote and the dry run say: the price factor now and, outside a window, when
    the next one starts (local time) and its factor. ``text``: "now: 1.0× — start after 20:00
    CET for 0.5× (half the cost)"."""
    now_f = off_peak.factor_at(t)
    out: dict = {"factor_now": now_f, "off_peak_factor": off_peak.factor,
                 "off_peak_now": now_f < 1.0, "next_off_peak": None, "next_off_peak_local": None}
    if now_f < 1.0:
        out["text"] = f"now: {_times(now_f)} (off-peak: {_share(now_f)})"
        return out
    nxt = off_peak.next_start(t)
    if nxt is None:
        out["text"] = "now: 1.0×"
        return out
    local = datetime.fromtimestamp(nxt, ZoneInfo(off_peak.timezone))
    same_day = local.date() == datetime.fromtimestamp(t, ZoneInfo(off_peak.timezone)).date()
    when = local.strftime("%H:%M %Z") if same_day else local.strftime("%a %H:%M %Z")
    out["next_off_peak"] = nxt
    out["next_off_peak_local"] = local.isoformat()
    out["text"] = (f"now: 1.0× — start after {when} for {_times(off_peak.factor)} "
                   f"({_share(off_peak.factor)})")
    return out


def waiting_text(off_peak: OffPeak | None, at: float) -> str:
    """What a job that asked ``start: off-peak`` shows while it waits: "waiting for the
    off-peak window (Wed 20:00 CET)"."""
    if off_peak is None:
        return "waiting for the off-peak window"
    local = datetime.fromtimestamp(at, ZoneInfo(off_peak.timezone))
    return f"waiting for the off-peak window ({local.strftime('%a %H:%M %Z')})"


def _times(f: float) -> str:
    return f"{f:.2f}".rstrip("0").rstrip(".") + "×" if f != int(f) else f"{f:.1f}×"


def _share(f: float) -> str:
    if f == 0:
        return "free"
    if abs(f - 0.5) < 1e-9:
        return "half the cost"
    return f"{f * 100:g}% of the cost"


# ------------------------------------------------------------------ parsing
def parse_window(text: str) -> Window:
    """One window from its text; ValueError saying what is wrong."""
    m = _WINDOW.match(text)
    if not m:
        raise ValueError(f"window {text!r}: expected '<days> HH:MM-HH:MM', e.g. "
                         "'Mon-Fri 20:00-07:00'")
    days = _days(m.group("days"), text)
    start = _minutes(int(m.group("h1")), int(m.group("m1")), text)
    end = _minutes(int(m.group("h2")), int(m.group("m2")), text)
    if start == 1440:
        raise ValueError(f"window {text!r}: a window cannot start at 24:00 (write 00:00 "
                         "of the next day)")
    if end <= start:
        end += 1440  # runs past midnight into the next day
    return Window(days, start, end)


def make_off_peak(timezone_name: str, factor: float, windows: list[str]) -> OffPeak:
    """The policy from its parts; ValueError naming the part that is wrong."""
    try:
        ZoneInfo(timezone_name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ValueError(f"timezone: unknown time zone {timezone_name!r} (an IANA name, e.g. "
                         "Europe/Berlin or UTC)") from e
    if not 0.0 <= factor < 1.0:
        raise ValueError(f"factor: expected a number from 0 up to (not including) 1, got "
                         f"{factor:g}")
    if not windows:
        raise ValueError("windows: expected at least one window, e.g. 'Mon-Fri 20:00-07:00'")
    return OffPeak(timezone_name, float(factor), tuple(parse_window(w) for w in windows),
                   tuple(windows))


def _days(text: str, whole: str) -> tuple[int, ...]:
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        ends = part.split("-")
        if len(ends) > 2 or not all(e.capitalize() in DAYS for e in ends):
            raise ValueError(f"window {whole!r}: days {part!r}: expected a day ({' '.join(DAYS)}) "
                             "or a range such as Mon-Fri")
        lo, hi = DAYS.index(ends[0].capitalize()), DAYS.index(ends[-1].capitalize())
        d = lo
        while True:
            out.add(d)
            if d == hi:
                break
            d = (d + 1) % 7
    if not out:
        raise ValueError(f"window {whole!r}: no days")
    return tuple(sorted(out))


def _minutes(h: int, m: int, whole: str) -> int:
    if m > 59 or h > 24 or (h == 24 and m):
        raise ValueError(f"window {whole!r}: {h:02d}:{m:02d} is not a time of day "
                         "(00:00 to 24:00)")
    return h * 60 + m


def off_peak_from_node(node: Node) -> OffPeak:
    """``off_peak: {timezone: Europe/Berlin, factor: 0.5, windows: [...]}`` in a budgets file's
    ``policy:``; a ConfigError naming the key and line."""
    fields = node.mapping({"timezone", "factor", "windows"})
    for key in ("timezone", "factor", "windows"):
        if key not in fields:
            raise node.error(f"off_peak: {key} is required")
    texts = [(w, w.string()) for w in fields["windows"].seq()]
    try:
        make_off_peak(fields["timezone"].string(), 0.0, ["Mon 00:00-01:00"])
    except ValueError as e:
        raise fields["timezone"].error(str(e)) from None
    factor = fields["factor"].number(minimum=0, maximum=1)
    if factor >= 1:
        raise fields["factor"].error("off_peak factor must be below 1 (1 is the full price)")
    if not texts:
        raise fields["windows"].error("expected at least one window, e.g. 'Mon-Fri 20:00-07:00'")
    for w, text in texts:
        try:
            parse_window(text)
        except ValueError as e:
            raise w.error(str(e)) from None
    return make_off_peak(fields["timezone"].string(), factor, [t for _, t in texts])


# ------------------------------------------------------------------ edges
def _edges(p: OffPeak, lo: float, hi: float) -> list[tuple[float, float]]:
    """The windows (merged, in order) that overlap ``[lo, hi)``, as UNIX seconds."""
    tz = ZoneInfo(p.timezone)
    first = datetime.fromtimestamp(lo, tz).date() - timedelta(days=2)
    last = datetime.fromtimestamp(hi, tz).date()
    out: list[tuple[float, float]] = []
    day = first
    while day <= last:
        for s, e in _day_edges(p, day.toordinal()):
            if e <= lo or s >= hi:
                continue
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((s, e))
        day += timedelta(days=1)
    return out


@lru_cache(maxsize=4096)
def _day_edges(p: OffPeak, ordinal: int) -> tuple[tuple[float, float], ...]:
    """The windows starting on one local day, as UNIX seconds, sorted by start."""
    day = date.fromordinal(ordinal)
    tz = ZoneInfo(p.timezone)
    out = []
    for w in p.windows:
        if day.weekday() in w.days:
            out.append((_instant(day, w.start, tz), _instant(day, w.end, tz)))
    out.sort()
    return tuple(out)


def _instant(day: date, minutes: int, tz: ZoneInfo) -> float:
    """UNIX seconds of local wall-clock ``minutes`` after ``day``'s midnight (past 1440: the
    following day). A skipped local time is the moment of the jump; a repeated one its
    first occurrence."""
    d = day + timedelta(days=minutes // 1440)
    m = minutes % 1440
    naive = datetime(d.year, d.month, d.day, m // 60, m % 60)
    t = naive.replace(tzinfo=tz, fold=0).timestamp()
    if datetime.fromtimestamp(t, tz).replace(tzinfo=None) != naive:
        # in the spring gap: the jump is between the two readings; find it to the second
        lo = min(t, naive.replace(tzinfo=tz, fold=1).timestamp())
        hi = max(t, naive.replace(tzinfo=tz, fold=1).timestamp())
        while hi - lo > 1.0:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, tz).replace(tzinfo=None) > naive:
                hi = mid
            else:
                lo = mid
        t = hi
    return t


__all__ = ["DAYS", "OffPeak", "Window", "describe_start", "make_off_peak", "off_peak_from_node",
           "parse_window", "priced_clock", "waiting_text",
           "weighted_seconds"]
