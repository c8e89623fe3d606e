"""Words for people: times, durations and requests as the spawn form and the queue page say
them (local time of the hub, never epochs)."""

from __future__ import annotations

import time
from datetime import datetime


def when(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "unknown (when running sessions end)"
    now = time.time() if now is None else now
    delta = ts - now
    if delta <= 1:
        return "now"
    at = datetime.fromtimestamp(ts).astimezone().strftime("%H:%M %Z")
    if delta < 3600:
        return f"in ~{max(1, round(delta / 60))} min ({at})"
    return f"in ~{delta / 3600:.1f} h ({at})"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def ask(request: dict | None) -> str:
    """What a session asked for: 'MIG 1g.10gb', '2 GPUs', 'an MPS share of 25%'."""
    if not request:
        return "a session"
    kind = request.get("kind")
    if kind == "mig":
        return f"MIG {request.get('profile')}"
    if kind == "mps":
        return f"an MPS share of {request.get('milli', 0) / 10:g}%"
    if kind == "gpu":
        n = request.get("gpus", 1)
        return f"{n} GPU{'s' if n != 1 else ''}"
    return "CPU only"
