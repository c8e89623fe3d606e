"""What a scheduler predicts, memoised: how long work will run, when running work frees its
GPUs, and how many GPU-hours pending work is expected to use.

:class:`Predictor` answers for one workload at a time (backfill.py's estimators, memoised by
workload and by the features the estimators read, so that workloads alike share one
prediction until a run is learnt); :class:`RunningEnds` sorts the predicted ends of running
work once per change of running work; :func:`next_free` reads those ends for a request.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Container, Mapping

from .backfill import (
    BACKFILL_QUANTILE,
    PREDICT_QUANTILE,
    RESERVE_QUANTILE,
    predict_runtime,
    predicted_end,
)
from .capacity import Cluster
from .model import HOUR, MILLI, Policy, RuntimeHistory, SliceRequest, Workload, request_milli

#: a workload's features as the estimators read them: alike workloads share a prediction
Features = tuple[object, ...]
#: per features, (the history's version of the workload's kind when predicted, prediction)
ByFeatures = dict[Features, tuple[int, float]]


def features(w: Workload) -> Features:
    """What the estimators read of ``w``."""
    return (w.user, w.project, w.kind, w.request.shape, w.command, w.time_limit)


class Predictor:
    """Run-time predictions and expected GPU-hours of workloads, memoised per workload (until
    the next full cycle, or until it stops) and per features (until its kind's history
    learns a run)."""

    def __init__(self, history: RuntimeHistory, policy: Policy, node_gpus: int) -> None:
        self.history = history
        self.policy = policy
        self.node_gpus = node_gpus  # GPUs of the largest node
        self.predicted: dict[str, float] = {}
        self.by_features: ByFeatures = {}
        self.predicted_long: dict[str, float] = {}
        self.by_features_long: ByFeatures = {}
        self.by_features_reserve: ByFeatures = {}
        self.demands: dict[str, float] = {}
        self.carried = False  # the next full cycle keeps what :meth:`carry` brought

    def carry(self, old: Predictor, same: Container[str]) -> None:
        """Take ``old``'s predictions, made for a history equal to this one's (core/kept.py):
        by features, and by workload for the ids in ``same`` (the very workloads it predicted)."""
        self.by_features, self.by_features_long = old.by_features, old.by_features_long
        self.by_features_reserve = old.by_features_reserve
        for mine, theirs in ((self.predicted, old.predicted),
                             (self.predicted_long, old.predicted_long),
                             (self.demands, old.demands)):
            mine.update([(wid, p) for wid, p in list(theirs.items()) if wid in same])
        self.carried = True

    def new_cycle(self) -> None:
        """A full cycle predicts every workload afresh (its history may have learnt runs),
        unless it is the first on predictions :meth:`carry` brought."""
        if self.carried:
            self.carried = False
            return
        self.predicted.clear()
        self.predicted_long.clear()
        self.demands.clear()

    def forget(self, wid: str) -> None:
        """``wid`` stopped: its predictions are no longer needed."""
        self.predicted.pop(wid, None)
        self.predicted_long.pop(wid, None)
        self.demands.pop(wid, None)

    def predict(self, w: Workload) -> float:
        """Predicted run time of ``w`` (seconds); workloads alike in every feature the
        predictor reads share one prediction until a run is learnt."""
        p = self.predicted.get(w.id)
        if p is None:
            sig = (w.user, w.project, w.kind, w.request.shape, w.command, w.time_limit)
            hit = self.by_features.get(sig)
            if hit is not None and hit[0] == self.history.kind_version.get(w.kind, 0):
                p = hit[1]
            else:
                p = predict_runtime(w, self.history, self.policy)
                self.by_features[sig] = (self.history.kind_version.get(w.kind, 0), p)
            self.predicted[w.id] = p
        return p

    def predict_long(self, w: Workload) -> float:
        """A cautious prediction (``BACKFILL_QUANTILE`` of past runs): what placement checks
        against reservations, so that work backfilled before a gang's reservation rarely
        runs into it."""
        p = self.predicted_long.get(w.id)
        if p is None and BACKFILL_QUANTILE == PREDICT_QUANTILE:
            p = self.predicted_long[w.id] = self.predict(w)  # the same prediction: once
        if p is None:
            sig = (w.user, w.project, w.kind, w.request.shape, w.command, w.time_limit)
            hit = self.by_features_long.get(sig)
            if hit is not None and hit[0] == self.history.kind_version.get(w.kind, 0):
                p = hit[1]
            else:
                p = predict_runtime(w, self.history, self.policy, BACKFILL_QUANTILE)
                self.by_features_long[sig] = (self.history.kind_version.get(w.kind, 0), p)
            self.predicted_long[w.id] = p
        return p

    def predict_reserve(self, w: Workload) -> float:
        """The most cautious prediction (``RESERVE_QUANTILE`` of past runs): when a blocked
        gang can count on the GPUs of running ``w``."""
        version = self.history.kind_version
        sig = features(w)
        hit = self.by_features_reserve.get(sig)
        if hit is not None and hit[0] == version.get(w.kind, 0):
            return hit[1]
        p = predict_runtime(w, self.history, self.policy, RESERVE_QUANTILE)
        self.by_features_reserve[sig] = (version.get(w.kind, 0), p)
        return p

    def short(self, w: Workload) -> bool:
        """Does ``w`` go in the short lane (``Policy.short_lane``): debug work predicted to
        run no longer than the lane allows?"""
        lane = self.policy.short_lane
        return lane > 0 and w.kind == "debug" and self.predict(w) <= lane

    def demand(self, w: Workload) -> float:
        """Expected GPU-hours of a pending workload, for the projected standing: 0 for a gang
        of whole nodes (:meth:`waits_for_nodes`), which mostly waits for a drain instead of
        starting in this cycle. Projecting its hours would rank its project's work behind it
        after other projects' while they, not it, use the GPUs: a project whose queue holds
        such gangs fell short of its share (month seed 2: 46.6 % delivered of a 50 % grant,
        docs/simulator.md, "Gangs of whole nodes in the projected standing")."""
        d = self.demands.get(w.id)
        if d is None:
            d = 0.0 if self.waits_for_nodes(w) else (
                request_milli(w.request) / MILLI * min(self.predict(w), self.policy.window)
                / HOUR)
            self.demands[w.id] = d
        return d

    def waits_for_nodes(self, w: Workload) -> bool:
        """Does ``w`` ask for at least as many GPUs as the largest node has (a gang of whole
        nodes)? One GPU is never that, even on a one-GPU node."""
        return (w.request.kind == "gpu" and w.request.gpus >= 2
                and w.request.gpus >= self.node_gpus)

    def gain_horizon(self, w: Workload) -> float:
        """Seconds of the run a preemption buys the requester: its protected run, or when it
        asks for no protection, its predicted run capped like a protection would be."""
        protected = self.policy.effective_min_runtime(w)
        if protected > 0:
            return protected
        cap = self.policy.cap_for(w.kind)
        return min(self.predict(w), cap) if cap > 0 else self.predict(w)


class RunningEnds:
    """The predicted ends of running work, sorted once and kept up to date as work starts
    (:meth:`started`) and stops (:meth:`stopped`) until the clock moves, a run is learnt (the
    predictions may change) or a new cycle begins (:meth:`changed`)."""

    def __init__(self, predictor: Predictor, policy: Policy) -> None:
        self.predictor = predictor
        self.policy = policy
        self.ends: list[tuple[float, str]] | None = None
        self.end_by_id: dict[str, float] = {}  # the end each entry of ``ends`` was made with
        self.ends_at = float("nan")
        self.versions: dict[str, int] = {}  # the history's versions ``ends`` was made with
        # the same ends at RESERVE_QUANTILE, for the list of ends they were made from
        self.reserve_ends: tuple[list[tuple[float, str]], list[tuple[float, str]]] | None = None

    def changed(self) -> None:
        """Sort again when next asked."""
        self.ends = None
        self.reserve_ends = None

    def _current(self, now: float) -> bool:
        return (self.ends is not None and self.ends_at == now
                and self.versions == self.predictor.history.kind_version)

    def started(self, w: Workload, now: float) -> None:
        """``w`` started at ``now``: its end goes in its place in the sorted list — the
        list a sort from scratch would make (entries are unique by id)."""
        if not self._current(now):
            self.changed()
            return
        assert self.ends is not None
        end = self.end_of(w, now, self.predictor.predict(w))
        bisect.insort(self.ends, (end, w.id))
        self.end_by_id[w.id] = end
        self.reserve_ends = None

    def stopped(self, wid: str) -> None:
        """``wid`` stopped: its entry leaves the list."""
        end = self.end_by_id.pop(wid, None)
        if self.ends is None or end is None:
            self.changed()
            return
        i = bisect.bisect_left(self.ends, (end, wid))
        if i < len(self.ends) and self.ends[i] == (end, wid):
            del self.ends[i]
            self.reserve_ends = None
        else:  # not where it should be: sort again
            self.changed()

    def running(self, running: Mapping[str, Workload], now: float) -> list[tuple[float, str]]:
        """(predicted end, id) of ``running`` work, ascending."""
        if not self._current(now):
            self.ends = sorted((self.end_of(wr, now, self.predictor.predict(wr)), wid)
                               for wid, wr in running.items())
            self.end_by_id = {wid: end for end, wid in self.ends}
            self.ends_at = now
            self.versions = dict(self.predictor.history.kind_version)
            self.reserve_ends = None
        assert self.ends is not None
        return self.ends

    def end_of(self, w: Workload, now: float, predicted: float) -> float:
        """When running ``w`` is expected to free its GPUs: its predicted end; with leases
        (``Policy.backfill_lease``), work on borrowed GPUs gives them back when they are
        due at the latest (it is preempted for the gang then)."""
        end = predicted_end(w, now, predicted)
        if self.policy.backfill_lease > 0 and w.backfill_until is not None:
            end = min(end, max(w.backfill_until, now))
        return end

    def reserving(self, running: Mapping[str, Workload], now: float
                  ) -> list[tuple[float, str]]:
        """(cautious predicted end, id) of ``running`` work, ascending: when a blocked gang
        can count on their GPUs (``RESERVE_QUANTILE`` of past runs); kept as long as
        :meth:`running`'s list is."""
        ends = self.running(running, now)
        if self.reserve_ends is None or self.reserve_ends[0] is not ends:
            cautious = []
            for _, wid in ends:
                wr = running[wid]
                cautious.append((self.end_of(wr, now, self.predictor.predict_reserve(wr)), wid))
            cautious.sort()
            self.reserve_ends = (ends, cautious)
        return self.reserve_ends[1]


def next_free(cluster: Cluster, req: SliceRequest, now: float,
              ends: Callable[[], list[tuple[float, str]]]) -> float:
    """Seconds until running work is predicted to free capacity of the kind ``req`` needs
    (enough whole GPUs — a GPU shared by MPS work once its last share has ended; a GPU
    outside MIG mode for a share; a MIG GPU for an instance), given the running work's
    predicted ends (``ends()``, :meth:`RunningEnds.running`; asked only when needed),
    ignoring the queue ahead and node boundaries: how much sooner a preemption can start it
    at most. Work already past its predicted end is expected to run half again as long as it
    has so far (``backfill.predicted_end``); 0 when enough is free already; ∞ when nothing
    would ever free enough."""
    c = cluster
    models = frozenset(req.gpu_model.split("|")) if req.gpu_model else None
    inf = float("inf")

    def usable(node: str, gpu: int) -> bool:
        n = c.by_name[node]
        return gpu >= 0 and n.healthy and (models is None or n.gpus[gpu].model in models)

    have = 0
    holders: dict[tuple[str, int], int] = {}  # a GPU is whole again when all have ended
    if req.kind == "gpu":
        have = sum(1 for n in c.nodes if n.healthy for i in n.free_whole
                   if n.gpus[i].reserved_at == inf
                   and (models is None or n.gpus[i].model in models))
        if have >= req.gpus:
            return 0.0
    for end, wid in ends():
        p = c.allocations.get(wid)
        if p is None:
            continue
        if req.kind == "gpu":
            for sl in p.slices:
                if sl.kind in ("gpu", "mps") and usable(sl.node, sl.gpu):
                    key = (sl.node, sl.gpu)
                    left = holders.get(key, len(c.by_name[sl.node].gpus[sl.gpu].tenants)) - 1
                    holders[key] = left
                    if left == 0:
                        have += 1
            if have >= req.gpus:
                return max(0.0, end - now)
        elif req.kind == "mps":
            if any(sl.kind in ("gpu", "mps") and usable(sl.node, sl.gpu) for sl in p.slices):
                return max(0.0, end - now)
        elif req.kind == "mig":
            if any(sl.kind == "mig" and usable(sl.node, sl.gpu) for sl in p.slices):
                return max(0.0, end - now)
        else:
            return max(0.0, end - now)
    return inf
