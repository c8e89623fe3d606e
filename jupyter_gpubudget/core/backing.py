"""Where every account stands, and whether a project's grant backs more work (docs/core.md
semantics 3 and 4).

:class:`Backing` keeps, between cycles, the grants the account tree gives out of the
cluster's GPU-hours, the standings of the last full cycle, and the GPU-hours promised to
protected runs still going (a protected run's rest is spoken for: a grant that has promised
it cannot back more work). Per member of a project it keeps the same figures — usage inside
the project, hours promised, GPUs their backed work holds — against the member's limits
(members.py): past either limit their work is not backed, exactly as past the grant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .accounts import AccountTree
from .members import over_limit
from .model import HOUR, MILLI, Placement, Policy, Workload, request_milli
from .ranking import Standings, compute_standings
from .usage import MemberUsage

Member = tuple[str, str]  # (project, user)


class Backing:
    """Grants, standings and promised protected GPU-hours of one scheduler's accounts."""

    def __init__(self, accounts: AccountTree, capacity_gpu_hours: float, policy: Policy) -> None:
        self.accounts = accounts
        self.capacity_gpu_hours = capacity_gpu_hours
        self.policy = policy
        self._grants: dict[str, float] | None = None
        # per project, (account, grant) from the top of the tree down to it
        self.paths: dict[str, tuple[tuple[str, float], ...]] = {}
        self.st: Standings | None = None  # as of the last full cycle (None: none yet)
        # per account, the GPU-hours the protected runs going on under it still hold
        self.committed: dict[str, float] = {}
        # per member: the GPU-hours their protected runs still hold, and the GPUs (slice
        # fractions) their backed running work holds
        self.member_committed: dict[Member, float] = {}
        self.member_gpus: dict[Member, float] = {}
        #: per project, whether its grant or an ancestor's is spent (backs no more work, of
        #: any size), as of the standings and promises it was found with (``_spent_of``)
        self._spent: dict[str, bool] = {}
        #: per (project, demand): whether its grants cover that much more (kept as ``_spent``)
        self._fits: dict[tuple[str, float], bool] = {}
        self._spent_of: tuple[object, object] | None = None

    def set_accounts(self, accounts: AccountTree) -> None:
        """A budget change: grants and standings are worked out afresh."""
        self.accounts = accounts
        self._grants = None
        self.paths = {}
        self.st = None

    def grants(self) -> dict[str, float]:
        """GPU-hours per window of every account."""
        if self._grants is None:
            self._grants = self.accounts.effective_grants(self.capacity_gpu_hours)
        return self._grants

    def stand(self, usage: Mapping[str, float], members: MemberUsage,
              running: Iterable[Workload], now: float) -> Standings:
        """Standings from ``usage`` (GPU-hours in the window per project) and ``members``
        (per project and user), and the hours the ``running`` work's protected runs still
        hold at ``now``."""
        st = compute_standings(self.accounts, usage, self.grants(), members)
        self.st = st
        committed: dict[str, float] = {}
        m_committed: dict[Member, float] = {}
        m_gpus: dict[Member, float] = {}
        for w in running:
            if w.backed and w.placement:
                key = (w.project, w.user)
                m_gpus[key] = m_gpus.get(key, 0.0) + w.placement.fraction
            if w.backed and w.protected_until and w.protected_until > now and w.placement:
                left = w.placement.fraction * (w.protected_until - now) / HOUR
                if w.project in self.accounts:
                    for a in self.accounts.path(w.project):
                        committed[a] = committed.get(a, 0.0) + left
                    m_committed[key] = m_committed.get(key, 0.0) + left
        self.committed = committed
        self.member_committed, self.member_gpus = m_committed, m_gpus
        return st

    def backs(self, w: Workload, standings: Callable[[], Standings]) -> bool:
        """Does the project's grant (and every ancestor's) cover its window usage, the
        protected time already promised, and this workload's protected demand? Without
        standings yet, ``standings()`` works them out."""
        path = self.paths.get(w.project)
        if path is None:
            if not self.accounts.is_project(w.project):
                return False
            grants = self.grants()
            path = tuple((a, grants.get(a, 0.0)) for a in self.accounts.path(w.project))
            self.paths[w.project] = path
        st = self.st if self.st is not None else standings()
        if self.spent(w.project, path, st):
            return False  # no workload's demand (0 or more) fits under its grants
        need = request_milli(w.request) / MILLI * self.policy.effective_min_runtime(w) / HOUR
        fits = self._fits.get((w.project, need))  # (kept as long as ``_spent``)
        if fits is None:
            usage, committed = st.usage, self.committed
            fits = self._fits[(w.project, need)] = not any(
                g <= 0 or usage[a] + committed.get(a, 0.0) + need > g + 1e-9 for a, g in path)
        if not fits:
            return False
        return not self.accounts.accounts[w.project].member_limits \
            or self.member_over(w, st) is None

    def spent(self, project: str, path: tuple[tuple[str, float], ...], st: Standings) -> bool:
        """Is a grant on ``project``'s ``path`` spent, with no more work added (then
        :meth:`backs` is False for every workload of it: demands are never negative)? Kept
        while the standings and the promises are the same (:meth:`promise` and
        :meth:`release` change the promises)."""
        if self._spent_of is None or self._spent_of[0] is not st \
                or self._spent_of[1] is not self.committed:
            self._spent, self._fits, self._spent_of = {}, {}, (st, self.committed)
        spent = self._spent.get(project)
        if spent is None:
            usage, committed = st.usage, self.committed
            spent = self._spent[project] = any(
                g <= 0 or usage[a] + committed.get(a, 0.0) + 0.0 > g + 1e-9 for a, g in path)
        return spent

    def member_over(self, w: Workload, st: Standings | None = None
                    ) -> tuple[str, float, float, float] | None:
        """Which of its member's limits in its project ``w`` would pass if backed
        (:func:`members.over_limit`), or None."""
        if not self.accounts.is_project(w.project):
            return None
        limit = self.accounts.member_limit(w.project, w.user)
        if limit is None:
            return None
        st = st if st is not None else self.st
        key = (w.project, w.user)
        used = st.member_usage.get(key, 0.0) if st is not None else 0.0
        gpus = request_milli(w.request) / MILLI
        need = gpus * self.policy.effective_min_runtime(w) / HOUR
        return over_limit(limit, used, self.member_committed.get(key, 0.0),
                          self.member_gpus.get(key, 0.0), need, gpus)

    def promise(self, w: Workload, placement: Placement, protected: float, now: float) -> None:
        """``w`` started on ``placement``, protected until ``protected``: its project's grant
        (and every ancestor's) has promised that much more."""
        if w.project in self.accounts:
            promised = placement.fraction * (protected - now) / HOUR
            self._spent_of = None
            for a in self.accounts.path(w.project):
                self.committed[a] = self.committed.get(a, 0.0) + promised
            key = (w.project, w.user)
            self.member_committed[key] = self.member_committed.get(key, 0.0) + promised
            self.member_gpus[key] = self.member_gpus.get(key, 0.0) + placement.fraction

    def release(self, w: Workload, now: float) -> None:
        """Running ``w`` stopped at ``now``: what is left of its protected run is no longer
        promised."""
        key = (w.project, w.user)
        self._spent_of = None
        if w.backed and w.placement and key in self.member_gpus:
            self.member_gpus[key] = max(0.0, self.member_gpus[key] - w.placement.fraction)
        if w.backed and w.protected_until and w.protected_until > now and w.placement:
            left = w.placement.fraction * (w.protected_until - now) / HOUR
            for a in self.accounts.path(w.project) if w.project in self.accounts else ():
                self.committed[a] = max(0.0, self.committed.get(a, 0.0) - left)
            if key in self.member_committed:
                self.member_committed[key] = max(0.0, self.member_committed[key] - left)
