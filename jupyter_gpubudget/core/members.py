"""Members' limits inside a project (``member_limits:`` in the budgets file, or set by the
project's managers through the REST API): how many GPU-hours per window and how many GPUs
running at once a project's grant backs of one member's work. Past either limit the
member's work still runs, unbacked, exactly like work past the project's grant
(docs/core.md, "Fairness inside a project").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from .yamlnodes import Node

LIMIT_KEYS = ("gpu_hours", "gpus")
MAX_LIMIT_HOURS = 1e9  # the bound a grant has too
MAX_LIMIT_GPUS = 1e6  # a member's running-GPU limit at most
LIMIT_DECIMALS = 3


@dataclass(frozen=True, slots=True)
class MemberLimit:
    """What a project backs of one member's work: GPU-hours per window and GPUs running at
    once (slice fractions: a MIG 1g slice is a seventh); None: no limit of that kind."""

    gpu_hours: float | None = None
    gpus: float | None = None

    def as_json(self) -> dict[str, float | None]:
        return {"gpu_hours": self.gpu_hours, "gpus": self.gpus}


def valid_user_name(name: object) -> bool:
    """A user name as JupyterHub and the budgets file spell them: 1-255 characters, letters,
    digits and ``-_.@+``, not starting with ``-``."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and not name.startswith("-")
            and all(c.isalnum() or c in "-_.@+" for c in name))


def limit_problem(key: str, v: object) -> str | None:
    """Why ``v`` is no value for member limit ``key`` (``gpu_hours``, ``gpus``), or None."""
    if key not in LIMIT_KEYS:
        return f"unknown limit {key!r} (expected {' or '.join(LIMIT_KEYS)})"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"{key}: expected a number, got {type(v).__name__}"
    top = MAX_LIMIT_HOURS if key == "gpu_hours" else MAX_LIMIT_GPUS
    if isinstance(v, int) and not -top <= v <= top:  # an integer beyond any float as well
        return f"{key}: must be a number from 0 to {top:g}, got a number of {len(str(v))} digits"
    if not math.isfinite(v) or v < 0 or v > top:
        return f"{key}: must be a number from 0 to {top:g}, got {v!r}"
    exponent = Decimal(repr(float(v))).as_tuple().exponent
    if not isinstance(exponent, int) or exponent < -LIMIT_DECIMALS:
        return f"{key}: at most {LIMIT_DECIMALS} decimals, got {v!r}"
    return None


def member_limits(node: Node, name: str, children: list[str]
                  ) -> tuple[tuple[str, MemberLimit], ...]:
    """A project's ``member_limits:`` mapping, checked (sorted by user)."""
    if children:
        raise node.error(f"member_limits go on a project (an account without children), "
                         f"but {name!r} has children")
    out: dict[str, MemberLimit] = {}
    for user, limits in node.mapping().items():
        if not valid_user_name(user):
            raise limits.error(f"member_limits: {user!r} is not a user name (letters, digits "
                               "and '-_.@+')")
        got: dict[str, float] = {}
        for key, v in limits.mapping(set(LIMIT_KEYS)).items():
            why = limit_problem(key, v.value)
            if why is not None:
                raise v.error(f"member_limits: {user}: {why}")
            got[key] = float(v.value)  # type: ignore[arg-type]
        if not got:
            raise limits.error(f"member_limits: {user}: give gpu_hours, gpus or both")
        out[user] = MemberLimit(got.get("gpu_hours"), got.get("gpus"))
    return tuple(sorted(out.items()))


def over_limit(limit: MemberLimit | None, used_hours: float, promised_hours: float,
               running_gpus: float, need_hours: float, gpus: float
               ) -> tuple[str, float, float, float] | None:
    """Which of ``limit`` a member's new work would pass — ``("gpu_hours", used, limit,
    need)`` or ``("gpus", running, limit, gpus)`` — given the GPU-hours they used in the
    window, those their protected runs still hold, the GPUs their backed work holds, and the
    new work's protected GPU-hours and GPUs; None when within both (as a grant: usage +
    promised + need)."""
    if limit is None:
        return None
    used = used_hours + promised_hours
    if limit.gpu_hours is not None and used + need_hours > limit.gpu_hours + 1e-9:
        return ("gpu_hours", used, limit.gpu_hours, need_hours)
    if limit.gpus is not None and running_gpus + gpus > limit.gpus + 1e-9:
        return ("gpus", running_gpus, limit.gpus, gpus)
    return None


def over_limit_words(project: str, over: tuple[str, float, float, float]) -> str:
    """``over`` (:func:`over_limit`) in words for the researcher."""
    what, used, top, more = over
    unit = "GPU-h" if what == "gpu_hours" else "GPUs running"
    if used >= top - 1e-9:
        return f"over your member limit in {project}: {used:.0f} of {top:g} {unit} — runs unbacked"
    added = "protected GPU-h" if what == "gpu_hours" else "GPUs"
    return (f"past your member limit in {project} with this: {used:.0f} of {top:g} {unit}, "
            f"{more:g} more {added} — runs unbacked")
