"""Words for people: times, durations and requests as the spawn form and the queue page say
them (relative times: a clock time is written by the browser, in its local time)."""

from __future__ import annotations

import time


def when(ts: float | None, now: float | None = None) -> str:
    """'in ~12 min', 'in ~2.5 h': relative only. The clock time is the browser's to write
    (its local time, in the pages' one format); the hub's zone is not the reader's."""
    if ts is None:
        return "unknown (when running sessions end)"
    now = time.time() if now is None else now
    delta = ts - now
    if delta <= 1:
        return "now"
    if delta < 3600:
        return f"in ~{max(1, round(delta / 60))} min"
    return f"in ~{delta / 3600:.1f} h"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def ask(request: dict | None) -> str:
    """What a session asked for: 'MIG 1g.10gb', '2 GPUs', 'an MPS share of 25%', and
    'on cluster hpc' when it named one."""
    if not request:
        return "a session"
    if request.get("cluster"):
        return f"{ask({**request, 'cluster': None})} on cluster {request['cluster']}"
    kind = request.get("kind")
    if kind == "mig":
        return f"MIG {request.get('profile')}"
    if kind == "mps":
        return f"an MPS share of {request.get('milli', 0) / 10:g}%"
    if kind == "gpu":
        n = request.get("gpus", 1)
        return f"{n} GPU{'s' if n != 1 else ''}"
    return "CPU only"


def gpu_hours(h: float) -> str:
    """'0 GPU-h', '0.0083 GPU-h', '0.43 GPU-h', '412 GPU-h': below 0.1, two significant
    digits — a few minutes on a slice is never shown as free."""
    a = abs(h)
    if a == 0:
        return "0 GPU-h"
    if a < 1e-6:
        return "less than 0.000001 GPU-h"
    if a < 0.1:
        return f"{float(f'{h:.2g}'):f}".rstrip("0") + " GPU-h"
    return f"{h:.2f} GPU-h" if a < 10 else f"{h:.0f} GPU-h"


def span(seconds: float) -> str:
    """'45 s', '30 min', '1 h', '1 h 30 min', '7 days'."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 600 and round(seconds) % 60:
        return f"{int(seconds // 60)} min {round(seconds) % 60} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:.0f} days"
    h, m = int(seconds // 3600), round((seconds % 3600) / 60)
    if m == 60:
        h, m = h + 1, 0
    return f"{h} h" + (f" {m} min" if m else "")


def standing_words(standing: float | None, short: bool = False) -> str:
    """What a project's standing (used / grant) means for its next session."""
    if standing is None:
        return "no grant: unbacked" if short else \
            "no grant: its sessions are unbacked (never protected)"
    if standing < 1:
        return "under its share: starts first" if short else \
            ("under its share, so its sessions start before those of projects that used "
             "more of theirs")
    return "over its share: starts after others" if short else \
        ("over its share: its sessions start after those of projects under theirs, and are "
         "unbacked once the grant is used up")
