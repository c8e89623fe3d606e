"""MIG profile tables: which instances each GPU model offers and where they may be placed.

A MIG-enabled GPU has 8 memory slots and 7 compute slices. Each GPU-instance profile takes
``size`` consecutive memory slots starting at one of its allowed ``starts`` and ``compute``
compute slices (the tables match ``nvidia-smi mig -lgipp`` on each model). A slot mask
(bit i = memory slot i in use) describes a GPU's occupancy; everything here is precomputed
per mask so placement is table look-ups.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from .model import MIG_COMPUTE_SLICES, MILLI

SLOTS = 8
COMPUTE = MIG_COMPUTE_SLICES
FULL_MASK = (1 << SLOTS) - 1


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    compute: int  # compute slices (of 7)
    size: int  # memory slots (of 8)
    starts: tuple[int, ...]
    memory_gb: int

    @property
    def milli(self) -> int:
        """What the profile is charged: its compute slices as a fraction of the GPU."""
        return round(self.compute * MILLI / COMPUTE)


def _table(mem: tuple[int, int, int, int, int, int], with_1g_double: bool = True
           ) -> dict[str, MigProfile]:
    g1, g1d, g2, g3, g4, g7 = mem
    profiles = [
        MigProfile(f"1g.{g1}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), g1),
        MigProfile(f"2g.{g2}gb", 2, 2, (0, 2, 4), g2),
        MigProfile(f"3g.{g3}gb", 3, 4, (0, 4), g3),
        MigProfile(f"4g.{g4}gb", 4, 4, (0,), g4),
        MigProfile(f"7g.{g7}gb", 7, 8, (0,), g7),
    ]
    if with_1g_double:
        profiles.insert(1, MigProfile(f"1g.{g1d}gb", 1, 2, (0, 2, 4, 6), g1d))
    return {p.name: p for p in profiles}


#: GPU model name → its MIG profiles. Models not listed here cannot be MIG-partitioned.
MIG_TABLES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _table((5, 10, 10, 20, 20, 40)),
    "A100-80GB": _table((10, 20, 20, 40, 40, 80)),
    "H100-80GB": _table((10, 20, 20, 40, 40, 80)),
    "H200-141GB": _table((18, 35, 35, 71, 71, 141)),
}


def profiles_for(model: str) -> dict[str, MigProfile]:
    return MIG_TABLES.get(model, {})


@cache
def _span(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


@cache
def fits(model: str, profile: str, mask: int, compute_used: int) -> tuple[int, ...]:
    """Allowed start slots for ``profile`` on a GPU whose slots ``mask`` are in use."""
    p = MIG_TABLES[model][profile]
    if compute_used + p.compute > COMPUTE:
        return ()
    return tuple(s for s in p.starts if not (mask & _span(s, p.size)))


@cache
def potential(model: str, mask: int, compute_used: int) -> int:
    """How much the free part of a GPU can still host: Σ over profiles and their valid start
    slots of size². Placement keeps this high so small instances don't strand large ones."""
    total = 0
    for p in MIG_TABLES[model].values():
        total += len(fits(model, p.name, mask, compute_used)) * p.size * p.size
    return total


def occupy(profile: MigProfile, start: int, mask: int) -> int:
    return mask | _span(start, profile.size)


def release(profile: MigProfile, start: int, mask: int) -> int:
    return mask & ~_span(start, profile.size)


def fits_in(model: str, layout: frozenset[tuple[str, int]] | None, profile: str, mask: int,
            used_compute: int) -> list[int]:
    """Start slots where ``profile`` can go now on a GPU with this occupancy: anywhere it fits
    when the GPU is carved freely (``layout`` None), else only at the instances of that
    profile that exist in the GPU's fixed layout and are free."""
    starts = fits(model, profile, mask, used_compute)
    if layout is None:
        return list(starts)
    return [st for st in starts if (profile, st) in layout]
