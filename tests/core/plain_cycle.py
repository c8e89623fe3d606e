"""The full cycle as it was before its shortcuts, to compare a cycle with: every workload's
backing checked in full (no memo of spent grants or of demands that fit), the backed pass
asking about the memo before the backing, the idle pass scanning the whole queue (no stop
once no shape fits), the ranking made afresh (no ``RankMemo``) and the queue loaded one
workload at a time. :func:`plain` patches these in while a reference cycle is made."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from unittest import mock

from jupyter_gpubudget.core import cycle
from jupyter_gpubudget.core.backing import Backing
from jupyter_gpubudget.core.cycle import CycleState, memo_key
from jupyter_gpubudget.core.model import HOUR, MILLI, Workload, request_milli
from jupyter_gpubudget.core.ranking import INF, Standings, rank
from jupyter_gpubudget.core.scheduler import Scheduler
from jupyter_gpubudget.core.workqueue import WorkQueue, with_interconnect


def backs(self: Backing, w: Workload, standings: Callable[[], Standings]) -> bool:
    path = self.paths.get(w.project)
    if path is None:
        if not self.accounts.is_project(w.project):
            return False
        grants = self.grants()
        path = tuple((a, grants.get(a, 0.0)) for a in self.accounts.path(w.project))
        self.paths[w.project] = path
    st = self.st if self.st is not None else standings()
    need = request_milli(w.request) / MILLI * self.policy.effective_min_runtime(w) / HOUR
    usage, committed = st.usage, self.committed
    for a, g in path:
        if g <= 0 or usage[a] + committed.get(a, 0.0) + need > g + 1e-9:
            return False
    return not self.accounts.accounts[w.project].member_limits \
        or self.member_over(w, st) is None


def backed_pass(self: Scheduler, cyc: CycleState, ranked: list[tuple[float, Workload]]) -> None:
    now, pending, paths = cyc.now, self.pending, cyc.st.path_standing
    for _, w in ranked:
        if w.id not in pending or cyc.full():
            continue
        req = w.request
        end = now + self.predict_long(w)
        if memo_key(w, end, cyc.res_times, self.policy) in cyc.failed \
                and not (req.kind == "gpu" and req.gpus >= 2
                         and len(self.reservations) < self.policy.max_reservations):
            worst = cyc.preempt_failed.get(req.shape)
            if not cyc.pool or (worst is not None and paths[w.project] >= worst):
                cyc.later.append((w, cyc.memo_gen))
                continue
        if not self.is_backed(w, now):
            cyc.later.append((w, -1))
            continue
        if self.lane.held and req.kind == "gpu" and req.gpus > self.lane.room:
            with self.lane.lifted():
                self._consider(cyc, w)
        else:
            self._consider(cyc, w)
        if w.id in pending:
            cyc.later.append((w, cyc.memo_gen))


def rank_afresh(self: Scheduler, st: Standings) -> list[tuple[float, Workload]]:
    ranked = rank(list(self.pending.values()), self.accounts, st, self.demand, self.short)
    unranked = [w for w in self.pending.values() if not self.accounts.is_project(w.project)]
    self.waiting.rerank(ranked, unranked)
    return ranked


def add_all(self: WorkQueue, ws, running, policy) -> None:  # noqa: ANN001
    for w in ws:
        if w.id in self.pending or w.id in running:
            raise ValueError(f"workload {w.id} is already known")
        w = with_interconnect(w, policy)
        self.add(w)
        self.put(w.id, INF, bulk=True)
    self.order.sort()


@contextmanager
def plain() -> Iterator[None]:
    """Cycles made (and schedulers built) inside run without the shortcuts."""
    with ExitStack() as stack:
        for target, name, new in ((Backing, "backs", backs), (cycle, "nothing_fits",
                                                               lambda *a: False),
                                  (Scheduler, "_backed_pass", backed_pass),
                                  (Scheduler, "_rank", rank_afresh),
                                  (WorkQueue, "add_all", add_all)):
            stack.enter_context(mock.patch.object(target, name, new))
        yield
