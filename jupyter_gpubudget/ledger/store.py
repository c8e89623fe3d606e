"""Ledger operations. Each public method is one transaction (or joins the caller's session).

Invariants kept here, whatever process dies when:
- a workload has at most one open charge interval, and only while its state is ``running``;
- an interval is opened in the same transaction that marks the workload running, and closed
  (``UPDATE ... WHERE end IS NULL``) in the same transaction that moves it out of ``running``;
- a request carrying an idempotency key is applied at most once (the key is stored in the
  same transaction as the effect).
"""

from __future__ import annotations

import itertools
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, Row, Text, cast, event, func, inspect, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker
from sqlalchemy.sql.dml import Update

from . import busy, rollups
from .models import (
    AccountRow,
    ChargeRow,
    DecisionRow,
    DeviceClaimRow,
    GrantRow,
    IdempotencyRow,
    LeaderRow,
    NodeHealthRow,
    ServiceStateRow,
    UsageRollupRow,
    WorkloadRow,
)


def _claims_of(placement: list[dict]) -> list[tuple[str, int, int, int]]:
    """The GPUs a placement holds: (node, gpu, MIG instance's first slot or -1, milli)."""
    out = []
    for sl in placement or []:
        gpu = sl.get("gpu", -1) if isinstance(sl, dict) else -1
        if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0:
            ms = sl.get("mig_start", -1)
            out.append((str(sl.get("node")), gpu, ms if isinstance(ms, int) else -1,
                        int(sl.get("milli", 1000))))
    return out


TERMINAL = ("done", "failed", "cancelled", "preempted", "timeout")
STATES = ("pending", "running", *TERMINAL)


class LedgerError(Exception):
    """A request the ledger refuses. ``status`` is the HTTP status the service answers with."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


class WorkloadWatch:
    """The workloads this process wrote (committed) since the watcher last looked: what a
    reader of live work must read again. ``take()`` answers ``None`` when it cannot tell
    (the first time, and after a write it could not attribute to workloads, such as a bulk
    insert): then everything must be read again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()
        self._all = True

    def _note(self, ids: Iterable[str], everything: bool) -> None:
        with self._lock:
            if everything:
                self._all = True
            else:
                self._ids.update(ids)

    def take(self) -> set[str] | None:
        """The ids written since the last ``take`` (``None``: read everything), and reset."""
        with self._lock:
            out = None if self._all else self._ids
            self._ids, self._all = set(), False
            return out


#: keys of a write session's ``info``: what its transaction changed (see Ledger._watch_writes)
_W_IDS, _W_ALL = "gpubudget.workloads", "gpubudget.workloads_all"
_W_USAGE, _W_PREEMPT = "gpubudget.usage", "gpubudget.preemptions"
_WORKLOADS, _CHARGES = WorkloadRow.__tablename__, ChargeRow.__tablename__
_ROLLUPS = UsageRollupRow.__tablename__


class Ledger:
    def __init__(self, engine: Engine, read_engine: Engine | None = None) -> None:
        self.engine = engine
        self.read_engine = read_engine or engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)
        self.generation = 0  # bumped after every write transaction of this process
        #: bumped after every write of this process that changes what the scheduler reads
        #: (everything but checkpoints): while it stands still, the last state read holds
        self.state_version = 0
        #: called (from any thread) after every write transaction of this process
        self.on_write: Callable[[], None] | None = None
        self._by_user: dict[tuple, tuple[int, list[WorkloadRow]]] = {}
        #: bumped after every committed transaction that closed a charge interval (the
        #: hourly rollups changed): while it stands still, the last rollup read holds
        self.usage_version = 0
        #: bumped after every committed transaction that changed a workload's preemption
        #: count (or could have): what :meth:`preemptions_by_project` answers changed
        self.preemption_version = 0
        self._watches: weakref.WeakSet[WorkloadWatch] = weakref.WeakSet()
        #: run first in every write transaction of this process (replicas: the leader's
        #: fencing check, ``service/leader.py``); raises to refuse the write. None: no check
        self.fence: Callable[[Session], None] | None = None
        self._watch_writes()

    # ------------------------------------------------------------ change tracking
    def watch_workloads(self) -> WorkloadWatch:
        """A watch of the workloads this process writes (see :class:`WorkloadWatch`)."""
        w = WorkloadWatch()
        self._watches.add(w)
        return w

    def _watch_writes(self) -> None:
        """Note, per write transaction, which workloads it changed (ORM objects flushed, or
        statements naming them in ``changed_workloads``; any other statement on the workloads
        table counts as "everything"), and tell the watches once it has committed."""

        def flushed(s: Session, _ctx: Any) -> None:
            rows = [o for o in itertools.chain(s.new, s.dirty, s.deleted)
                    if isinstance(o, WorkloadRow)]
            if rows:
                s.info.setdefault(_W_IDS, set()).update(o.id for o in rows)
                for o in rows:  # a count changed (a new row's 0 changes nothing)
                    h = inspect(o).attrs.preemptions.history
                    if h.deleted or any(h.added):
                        s.info[_W_PREEMPT] = True

        def executed(st: ORMExecuteState) -> None:
            if st.is_select:
                return
            named = st.execution_options.get("changed_workloads")
            if named is not None:
                st.session.info.setdefault(_W_IDS, set()).update(named)
                return
            table = getattr(st.statement, "table", None)
            name = getattr(table, "name", None)
            if table is None or name == _ROLLUPS:
                st.session.info[_W_USAGE] = True
            # (charge intervals are updated with their workload's row — closed — or only in
            # their checkpoint; one inserted or deleted otherwise may be anyone's)
            if table is None or name == _WORKLOADS or (
                    name == _CHARGES and not isinstance(st.statement, Update)):
                st.session.info[_W_ALL] = st.session.info[_W_PREEMPT] = True

        def committed(s: Session) -> None:
            if s.in_nested_transaction():  # a savepoint released: told when the whole commits
                return
            ids, everything = s.info.pop(_W_IDS, ()), s.info.pop(_W_ALL, False)
            if s.info.pop(_W_USAGE, False):
                self.usage_version += 1
            if s.info.pop(_W_PREEMPT, False):
                self.preemption_version += 1
            if ids or everything:
                for w in list(self._watches):
                    w._note(ids, everything)

        def rolled_back(s: Session) -> None:
            if s.in_nested_transaction():  # a savepoint: what the rest wrote is still told
                return
            for k in (_W_IDS, _W_ALL, _W_USAGE, _W_PREEMPT):
                s.info.pop(k, None)

        event.listen(self._sessions, "after_flush", flushed)
        event.listen(self._sessions, "do_orm_execute", executed)
        event.listen(self._sessions, "after_commit", committed)
        event.listen(self._sessions, "after_rollback", rolled_back)

    def dispose(self) -> None:
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()

    @contextmanager
    def ro(self, s: Session | None = None) -> Iterator[Session]:
        """A read-only transaction (the caller's if given)."""
        if s is not None:
            yield s
            return
        with self._read_sessions.begin() as new:
            yield new

    # ------------------------------------------------------------ plumbing
    @contextmanager
    def tx(self, s: Session | None = None, changes_state: bool = True) -> Iterator[Session]:
        """A transaction: the caller's if given, else a new one committed on exit.
        ``changes_state=False``: it changes nothing the scheduler reads (a checkpoint)."""
        if s is not None:
            yield s
            return
        try:
            with self._sessions.begin() as new:
                if self.fence is not None:
                    self.fence(new)
                yield new
        finally:
            self._wrote(changes_state)

    def others_wrote(self) -> None:
        """Another process may have written (a standby replica reads what the leader
        writes): whatever this process cached from its own writes must be read again."""
        self.usage_version += 1
        self.preemption_version += 1
        for w in list(self._watches):
            w._note((), True)
        self._wrote(True)

    def writable(self) -> None:
        """Raise what a write transaction would raise now (SQLite: a write lock held
        elsewhere, after the busy timeout; any database: gone, unreachable) — writing
        nothing. The transaction begins as every write does (``BEGIN IMMEDIATE`` on SQLite)
        and is rolled back."""
        with self.engine.connect() as c:
            c.exec_driver_sql("SELECT 1")
            c.rollback()

    def _wrote(self, changes_state: bool = True) -> None:
        self.generation += 1
        if changes_state:
            self.state_version += 1
        if self.on_write is not None:
            self.on_write()

    def idempotent(self, key: str, fn: Callable[[Session], tuple[int, dict]],
                   now: float, fingerprint: str = "") -> tuple[int, dict, bool]:
        """Apply ``fn`` once per ``key``: returns (status, body, replayed). ``fingerprint``
        identifies the request (a digest of its body): the same key with another request is
        refused (422), as common APIs do, rather than answered with the first request's answer."""
        for _ in range(3):
            try:
                with self._sessions.begin() as s:
                    if self.fence is not None:
                        self.fence(s)
                    row = s.get(IdempotencyRow, key)
                    if row is not None:
                        if row.fingerprint and fingerprint and row.fingerprint != fingerprint:
                            raise LedgerError(422, "Idempotency-Key was already used with a "
                                                   "different request", "Idempotency-Key")
                        return row.status, row.response, True
                    status, body = fn(s)
                    s.add(IdempotencyRow(key=key, created_at=now, status=status, response=body,
                                         fingerprint=fingerprint))
                return status, body, False
            except IntegrityError:
                continue  # a concurrent twin won the race: read its answer
            finally:
                self._wrote()
        raise LedgerError(409, f"idempotency key {key!r} is contended")

    # ------------------------------------------------------------ accounts and grants
    def sync_budgets(self, budgets: Any, now: float, source: str = "budgets.yaml",
                     copy: tuple[str, str, str] | None = None) -> list[str]:
        """Mirror the budgets file's tree; record a grant version when the file's grant changed.

        Grants changed through the API stay in force until the file itself changes that
        account's grant. Returns the accounts whose grant got a new version. ``copy``
        (digest, source, text): the file the service replicas agree on, kept with the lease
        in the same transaction (``service/budgets_copy.py``)."""
        tree = budgets.accounts
        changed: list[str] = []
        with self.tx() as s:
            if copy is not None:
                s.execute(update(LeaderRow).where(LeaderRow.id == 1).values(
                    budgets_digest=copy[0], budgets_source=copy[1], budgets_text=copy[2]))
            for name, a in tree.accounts.items():
                row = s.get(AccountRow, name)
                if row is None:
                    row = AccountRow(name=name)
                    s.add(row)
                row.parent = a.parent
                row.members = sorted(a.members)
                row.managers = sorted(a.managers)
                row.is_project = not a.children
                row.updated_at = now
            s.flush()
            for name, a in tree.accounts.items():
                last_file = s.scalars(select(GrantRow).where(
                    GrantRow.account == name, GrantRow.source == "budgets")
                    .order_by(GrantRow.version.desc()).limit(1)).first()
                if last_file is not None and (last_file.grant_hours, last_file.share_pct) == (
                        a.grant_hours, a.share_pct):
                    continue
                self._new_grant(s, name, a.grant_hours, a.share_pct, f"file:{source}", now,
                                "budgets", "loaded from the budgets file")
                changed.append(name)
        return changed

    def _new_grant(self, s: Session, account: str, grant_hours: float | None,
                   share_pct: float | None, by: str, now: float, source: str,
                   note: str) -> GrantRow:
        version = (s.scalar(select(func.max(GrantRow.version))
                            .where(GrantRow.account == account)) or 0) + 1
        row = GrantRow(account=account, version=version, grant_hours=grant_hours,
                       share_pct=share_pct, changed_by=by, changed_at=now, source=source,
                       note=note)
        s.add(row)
        s.add(DecisionRow(at=now, kind="grant", actor=by, reason=note,
                          detail={"account": account, "version": version,
                                  "grant_hours": grant_hours, "share_pct": share_pct}))
        s.flush()
        return row

    def set_grant(self, account: str, grant_hours: float | None, share_pct: float | None,
                  by: str, now: float, note: str = "", s: Session | None = None) -> GrantRow:
        with self.tx(s) as s:
            if s.get(AccountRow, account) is None:
                raise LedgerError(404, f"no account {account!r}")
            return self._new_grant(s, account, grant_hours, share_pct, by, now, "api", note)

    def accounts(self) -> list[AccountRow]:
        with self.ro() as s:
            return list(s.scalars(select(AccountRow).order_by(AccountRow.name)))

    def current_grants(self) -> dict[str, GrantRow]:
        with self.ro() as s:
            latest = (select(GrantRow.account, func.max(GrantRow.version).label("v"))
                      .group_by(GrantRow.account).subquery())
            rows = s.scalars(select(GrantRow).join(
                latest, (GrantRow.account == latest.c.account) & (GrantRow.version == latest.c.v)))
            return {r.account: r for r in rows}

    def grant_history(self, account: str) -> list[GrantRow]:
        with self.ro() as s:
            return list(s.scalars(select(GrantRow).where(GrantRow.account == account)
                                  .order_by(GrantRow.version)))

    # ------------------------------------------------------------ workloads
    def submit(self, *, project: str, user: str, kind: str, request: dict, now: float,
               command: list[str] | None = None, env: dict | None = None, min_runtime: float = 0.0,
               resumable: bool = False, time_limit: float | None = None,
               backend: str = "local", name: str = "", workload_id: str | None = None,
               checkpoint_interval: float | None = None, max_pending: int = 0,
               cluster: str | None = None, s: Session | None = None,
               array: tuple[str, int, int] | None = None,
               after: tuple[list[str], str] | None = None,
               not_before: float | None = None) -> WorkloadRow:
        """A new pending workload. ``max_pending`` (0: none): refused (429) when ``user``
        already has that many pending — counted in the same write transaction, so that
        concurrent submissions cannot slip past it (SQLite; PostgreSQL may let a few
        simultaneous ones through)."""
        with self.tx(s) as s:
            if s.get(AccountRow, project) is None:
                raise LedgerError(400, f"no project {project!r}", "project")
            if max_pending:
                n = self.pending_of(user, s, now)
                if n >= max_pending:
                    raise LedgerError(
                        429, f"pending: {user} has {n} workloads waiting in the queue, the "
                             f"most one user may have (policy max_pending_per_user: "
                             f"{max_pending}); cancel some or wait until they start",
                        "pending")
            row = WorkloadRow(id=workload_id or uuid.uuid4().hex[:16], name=name,
                              project=project, user=user, kind=kind, state="pending",
                              request=request, command=command, env=env, min_runtime=min_runtime,
                              resumable=resumable, time_limit=time_limit, backend=backend,
                              submitted_at=now, preemptions=0, backed=False, reason="",
                              checkpoint_interval=checkpoint_interval, cluster=cluster,
                              not_before=not_before)
            if array is not None:  # (array id, index, max_running): a task of a job array
                row.array_id, row.array_index, row.array_max = array
            if after is not None:  # ([ids], afterok | afterany | afternotok)
                row.after, row.after_kind = " ".join(after[0]), after[1]
            s.add(row)
            s.flush()
            return row

    def pending_of(self, user: str, s: Session | None = None, now: float | None = None) -> int:
        """How many workloads ``user`` has waiting in the queue (jobs and sessions); a job
        that runs after others is not counted (it waits for them, not for GPUs), nor, at
        ``now``, one that waits for its off-peak window (``start: off-peak``)."""
        with self.ro(s) as s:
            q = select(func.count()).select_from(WorkloadRow).where(
                WorkloadRow.user == user, WorkloadRow.state == "pending",
                WorkloadRow.after.is_(None))
            if now is not None:
                q = q.where(WorkloadRow.not_before.is_(None) | (WorkloadRow.not_before <= now))
            return s.scalar(q) or 0

    def get(self, workload_id: str, s: Session | None = None) -> WorkloadRow | None:
        with self.ro(s) as s:
            return s.get(WorkloadRow, workload_id)

    def workloads(self, *, user: str | None = None, states: tuple[str, ...] | None = None,
                  kind: str | None = None, backend: str | None = None) -> list[WorkloadRow]:
        with self.ro() as s:
            q = select(WorkloadRow)
            if user is not None:
                q = q.where(WorkloadRow.user == user)
            if states is not None:
                q = q.where(WorkloadRow.state.in_(states))
            if kind is not None:
                q = q.where(WorkloadRow.kind == kind)
            if backend is not None:
                q = q.where(WorkloadRow.backend == backend)
            return list(s.scalars(q.order_by(WorkloadRow.submitted_at, WorkloadRow.id)))

    #: columns of :meth:`live` (JSON columns as their stored text: equal text, equal value)
    LIVE_COLUMNS = ("id", "project", "user", "kind", "state", "min_runtime", "resumable",
                    "time_limit", "backend", "submitted_at", "started_at", "backed",
                    "protected_until", "checkpoint_interval", "backfill_until",
                    "array_id", "array_max", "after", "after_kind", "not_before")

    def live(self, backend: str | None = None,
             states: tuple[str, ...] = ("pending", "running")) -> list[Row]:
        """Pending and running workloads (of ``backend``, or all) as plain rows — what every
        cycle reads, without building ORM objects: ``request`` and ``placement`` come as
        their stored JSON text (the caller decodes, and may reuse what it decoded before)."""
        t = WorkloadRow.__table__.c
        cols = [t[c] for c in self.LIVE_COLUMNS]
        cols += [cast(t.request, Text).label("request_json"),
                 cast(t.placement, Text).label("placement_json"),
                 cast(t.command, Text).label("command_json")]
        q = select(*cols).where(t.state.in_(states))
        if backend is not None:
            q = q.where(t.backend == backend)
        with self.ro() as s:
            return s.execute(q.order_by(t.submitted_at, t.id)).all()

    def array_tasks(self, array_id: str) -> list[WorkloadRow]:
        """The tasks of a job array, by index (none: no such array)."""
        with self.ro() as s:
            return list(s.scalars(select(WorkloadRow).where(WorkloadRow.array_id == array_id)
                                  .order_by(WorkloadRow.array_index)))

    #: how a workload ended, for work that runs after it: succeeded (True) or not (False)
    ENDED = {"done": True, "failed": False, "cancelled": False, "preempted": False,
             "timeout": False}

    def outcomes(self, ids: Iterable[str]) -> dict[str, bool]:
        """Of these workloads, those that have ended, and whether each succeeded."""
        t = WorkloadRow.__table__.c
        wanted, out = sorted(set(ids)), {}
        with self.ro() as s:
            for i in range(0, len(wanted), 500):
                for wid, state in s.execute(select(t.id, t.state).where(
                        t.id.in_(wanted[i:i + 500]))):
                    if state in self.ENDED:
                        out[wid] = self.ENDED[state]
        return out

    def live_by_id(self, ids: Iterable[str]) -> list[Row]:
        """The rows of :meth:`live` for these workloads, whatever their state (the caller
        drops those no longer pending or running)."""
        t = WorkloadRow.__table__.c
        cols = [t[c] for c in self.LIVE_COLUMNS]
        cols += [cast(t.request, Text).label("request_json"),
                 cast(t.placement, Text).label("placement_json"),
                 cast(t.command, Text).label("command_json")]
        wanted, out = sorted(set(ids)), []
        with self.ro() as s:
            for i in range(0, len(wanted), 500):
                out += s.execute(select(*cols).where(t.id.in_(wanted[i:i + 500]))).all()
        return out

    def open_charges(self, workloads: Iterable[str] | None = None) -> list[Row]:
        """Open intervals (of these workloads, or all) as plain rows (workload, seq, project,
        user, milli, start, checkpoint)."""
        t = ChargeRow.__table__.c
        q = select(t.workload, t.seq, t.project, t.user, t.milli, t.start,
                   t.checkpoint).where(t.end.is_(None))
        with self.ro() as s:
            if workloads is None:
                return s.execute(q).all()
            wanted, out = sorted(set(workloads)), []
            for i in range(0, len(wanted), 500):
                out += s.execute(q.where(t.workload.in_(wanted[i:i + 500]))).all()
            return out

    def workloads_of(self, user: str, states: tuple[str, ...] | None = None) -> list[WorkloadRow]:
        """``workloads(user=...)`` served from memory until this process writes again.

        Only valid while this process is the ledger's only writer (the service is)."""
        key = (user, states)
        gen = self.generation
        hit = self._by_user.get(key)
        if hit is not None and hit[0] == gen:
            return hit[1]
        rows = self.workloads(user=user, states=states)
        if len(self._by_user) > 10000:
            self._by_user.clear()
        self._by_user[key] = (gen, rows)
        return rows

    def start(self, workload_id: str, *, placement: list[dict], milli: int, backed: bool,
              protected_until: float | None, now: float, actor: str = "scheduler",
              reason: str = "", backfill_until: float | None = None,
              cluster: str | None = None, after_release: bool = False,
              s: Session | None = None) -> ChargeRow:
        """Mark a pending workload running and open its charge interval (one transaction).

        The interval claims the placement's GPUs (``device_claims``). It is refused (409,
        nothing written) when another interval holds one of them at ``now`` beyond the GPU's
        size: still open, or closed after ``now`` (a victim stopped after the cycle that
        preempted it). ``after_release``: the interval opens when the last of those closed
        intervals ended instead (the scheduling loop's successors: a GPU is never charged
        to its victim and its successor at once); ``protected_until`` moves with it. An open
        one is refused either way."""
        with self.tx(s) as s:
            w = s.get(WorkloadRow, workload_id, with_for_update=True)
            if w is None:
                raise LedgerError(404, f"no workload {workload_id!r}")
            if w.state != "pending":
                raise LedgerError(409, f"workload {workload_id} is {w.state}, not pending")
            claims = _claims_of(placement)
            opens = self._free_from(s, workload_id, claims, now, after_release)
            if opens > now and protected_until is not None:
                protected_until += opens - now
            now = opens
            seq = (s.scalar(select(func.max(ChargeRow.seq))
                            .where(ChargeRow.workload == workload_id)) or 0) + 1
            w.state, w.started_at, w.placement = "running", now, placement
            w.backed, w.protected_until, w.backend_ref = backed, protected_until, None
            w.backfill_until = backfill_until
            if cluster is not None:  # where it runs (several clusters)
                w.cluster = cluster
            w.ended_at = None
            charge = ChargeRow(workload=workload_id, seq=seq, project=w.project, user=w.user,
                               milli=milli, start=now, end=None, checkpoint=now, closed_by="")
            s.add(charge)
            s.add(DecisionRow(at=now, kind="start", workload=workload_id, actor=actor,
                              reason=reason, detail={"placement": placement, "backed": backed,
                                                     "protected_until": protected_until}))
            s.flush()
            for node, gpu, mig_start, m in claims:
                s.add(DeviceClaimRow(charge=charge.id, workload=workload_id, node=node,
                                     gpu=gpu, mig_start=mig_start, milli=m, start=now,
                                     end=None))
            s.flush()
            return charge

    def _free_from(self, s: Session, workload_id: str,
                   claims: list[tuple[str, int, int, int]], now: float,
                   after_release: bool) -> float:
        """When ``claims`` may open (``now``, or later with ``after_release``), or
        LedgerError 409 naming the device and who holds it. Held: an interval's claim on
        the GPU that is open or ends after the new one's start; too much: the same MIG
        instance or a whole GPU twice, or shares beyond the GPU's size (a rounding milli
        per share allowed)."""
        opens = now
        by_gpu: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for node, gpu, mig_start, m in claims:
            by_gpu.setdefault((node, gpu), []).append((mig_start, m))
        for (node, gpu), mine in sorted(by_gpu.items()):
            d = DeviceClaimRow
            held = s.execute(select(d.workload, d.mig_start, d.milli, d.start, d.end).where(
                d.node == node, d.gpu == gpu, d.workload != workload_id,
                (d.end.is_(None)) | (d.end > now))).all()
            if not held:
                continue
            total = sum(m for _, m in mine) + sum(h.milli for h in held)
            same = {ms for ms, _ in mine if ms >= 0} & {h.mig_start for h in held}
            if total <= 1000 + len(mine) + len(held) and not same:
                continue
            still = [h for h in held if h.end is None]
            if still or not after_release:
                h = (still or held)[0]
                raise LedgerError(
                    409, f"GPU {gpu} of node {node} is held by workload {h.workload}'s "
                         + ("open charge interval" if h.end is None else
                            f"charge interval until {h.end:.3f}")
                         + f" (from {h.start:.3f}): a second interval on it from "
                         f"{now:.3f} would charge it twice", "placement")
            opens = max(opens, *(h.end for h in held))
        return opens

    def set_backend_ref(self, workload_id: str, ref: str, s: Session | None = None) -> None:
        with self.tx(s) as s:
            s.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id,
                                                WorkloadRow.state == "running")
                      .values(backend_ref=ref)
                      .execution_options(changed_workloads=(workload_id,)))

    def stop(self, workload_id: str, *, now: float | None, state: str, closed_by: str,
             reason: str = "", exit_code: int | None = None, actor: str = "scheduler",
             s: Session | None = None) -> WorkloadRow:
        """Move a workload out of ``running`` (or ``pending``) and close its open interval.

        ``state`` is the new state: a terminal one, or ``pending`` to requeue (resumable jobs
        after preemption). Closing is ``UPDATE ... WHERE end IS NULL``: a second stop charges
        nothing more. ``now=None`` settles a workload found dead after a crash: its interval
        ends at its last checkpoint (the unknown tail is not charged)."""
        if state not in STATES or state == "running":
            raise LedgerError(400, f"cannot stop into state {state!r}", "state")
        with self.tx(s) as s:
            w = s.get(WorkloadRow, workload_id, with_for_update=True)
            if w is None:
                raise LedgerError(404, f"no workload {workload_id!r}")
            if w.state in TERMINAL:
                raise LedgerError(409, f"workload {workload_id} is already {w.state}")
            if now is None:
                open_row = s.scalars(select(ChargeRow).where(
                    ChargeRow.workload == workload_id, ChargeRow.end.is_(None))).first()
                now = open_row.checkpoint if open_row is not None else (w.started_at or 0.0)
            self._close(s, workload_id, now, closed_by)
            was_running = w.state == "running"
            w.state, w.reason = state, reason
            if state == "pending":
                w.started_at = w.placement = w.protected_until = w.backend_ref = None
                w.backfill_until = None
                w.backed = False
            else:
                w.ended_at, w.exit_code = now, exit_code
            if closed_by == "preempt" and was_running:
                w.preemptions += 1
            return w

    def _close(self, s: Session, workload_id: str, end: float, closed_by: str) -> int:
        # an interval never ends before it starts (a clock step back is charged zero, not < 0)
        open_rows = list(s.scalars(select(ChargeRow).where(
            ChargeRow.workload == workload_id, ChargeRow.end.is_(None))))
        closed = 0
        for c in open_rows:
            done = s.execute(update(ChargeRow).where(ChargeRow.id == c.id,
                                                     ChargeRow.end.is_(None))
                             .values(end=max(end, c.start), checkpoint=max(end, c.start),
                                     closed_by=closed_by)).rowcount
            if done:  # closed here, exactly once: its usage joins the hourly rollups
                rollups.add(s, c.project, c.milli, c.start, max(end, c.start))
                busy.add_closed(s, c, max(end, c.start), closed_by)
                s.execute(update(DeviceClaimRow).where(DeviceClaimRow.charge == c.id,
                                                       DeviceClaimRow.end.is_(None))
                          .values(end=max(end, c.start)))
                s.info[_W_USAGE] = True
                closed += 1
        return closed

    def checkpoint(self, now: float, workload_ids: list[str] | None = None,
                   s: Session | None = None) -> int:
        """Record that the open intervals' workloads are still running at ``now``."""
        with self.tx(s, changes_state=False) as s:
            q = update(ChargeRow).where(ChargeRow.end.is_(None), ChargeRow.checkpoint < now)
            if workload_ids is not None:
                q = q.where(ChargeRow.workload.in_(workload_ids))
            return s.execute(q.values(checkpoint=now)).rowcount or 0

    def open_interval(self, workload_id: str, s: Session | None = None) -> ChargeRow | None:
        with self.ro(s) as s:
            return s.scalars(select(ChargeRow).where(ChargeRow.workload == workload_id,
                                                     ChargeRow.end.is_(None))).first()

    def open_intervals(self) -> dict[str, ChargeRow]:
        with self.ro() as s:
            return {c.workload: c for c in s.scalars(select(ChargeRow)
                                                     .where(ChargeRow.end.is_(None)))}

    # ------------------------------------------------------------ usage
    def charges(self, since: float | None = None, project: str | None = None,
                workload: str | None = None) -> list[ChargeRow]:
        with self.ro() as s:
            q = select(ChargeRow)
            if since is not None:
                q = q.where((ChargeRow.end.is_(None)) | (ChargeRow.end > since))
            if project is not None:
                q = q.where(ChargeRow.project == project)
            if workload is not None:
                q = q.where(ChargeRow.workload == workload)
            return list(s.scalars(q.order_by(ChargeRow.id)))

    def usage_for_window(self, since: float) -> list[tuple[str, float, float, float]]:
        """The hourly rollups of closed intervals that may count after ``since`` as (project,
        start, end, milli spread evenly between them): a bounded read however long the
        history (open intervals: :meth:`open_charges`)."""
        with self.ro() as s:
            closed = []
            for project, hour, gpu_ms, last_end in rollups.buckets(s, since):
                end = max(last_end, hour + 1.0)
                closed.append((project, hour, end, gpu_ms / (end - hour)))
            return closed

    def member_usage_for_window(self, since: float
                                ) -> dict[tuple[str, int], list[tuple[str, float]]]:
        """Each user's part of the hourly rollups :meth:`usage_for_window` reads: per
        (project, hour), (user, milli-GPU-seconds charged), sorted by user."""
        with self.ro() as s:
            return rollups.member_parts(s, since)

    def recent_runs(self, limit: int) -> list[tuple[str, str, str, float, dict, list | None]]:
        """The last ``limit`` finished runs (user, project, kind, seconds, request, command),
        oldest first, for runtime prediction."""
        t = WorkloadRow.__table__.c
        with self.ro() as s:
            rows = s.execute(select(t.user, t.project, t.kind, t.started_at, t.ended_at,
                                    t.request, t.command)
                             .where(t.state == "done", t.started_at.is_not(None),
                                    t.ended_at.is_not(None))
                             .order_by(t.ended_at.desc()).limit(limit)).all()
            return [(u, p, k, e - st, req, cmd) for u, p, k, st, e, req, cmd in reversed(rows)]

    def recent_losses(self, since: float) -> list[tuple[float, float]]:
        """(time, GPU-hours thrown away) of each preemption the scheduler decided since
        ``since``, oldest first (``Policy.finish_drain_budget``): one ``preempting`` or
        ``preempt-requested`` decision is logged per preemption, with its loss."""
        with self.ro() as s:
            rows = s.execute(select(DecisionRow.at, DecisionRow.detail)
                             .where(DecisionRow.at >= since,
                                    DecisionRow.kind.in_(("preempting", "preempt-requested")))
                             .order_by(DecisionRow.at)).all()
        out = []
        for at, detail in rows:
            lost = detail.get("lost_gpu_hours") if isinstance(detail, dict) else None
            if isinstance(lost, int | float) and not isinstance(lost, bool) and lost > 0:
                out.append((at, float(lost)))
        return out

    def preemptions_by_project(self) -> dict[str, int]:
        with self.ro() as s:
            rows = s.execute(select(WorkloadRow.project, func.sum(WorkloadRow.preemptions))
                             .group_by(WorkloadRow.project))
            return {p: int(n or 0) for p, n in rows}

    def totals(self) -> dict[str, float]:
        """Closed intervals only: GPU-milli-seconds charged per project (exact sums)."""
        with self.ro() as s:
            rows = s.execute(select(ChargeRow.project, ChargeRow.milli, ChargeRow.start,
                                    ChargeRow.end).where(ChargeRow.end.is_not(None)))
            out: dict[str, float] = {}
            for project, milli, start, end in rows:
                out[project] = out.get(project, 0.0) + milli * (end - start)
            return out

    # ------------------------------------------------------------ busy time and reports
    def record_busy(self, samples: Iterable[tuple[str, float, float, float, str]],
                    s: Session | None = None) -> int:
        """Record busy samples ``(workload, start, end, busy fraction, source)`` beside
        the charge intervals they fall in (``ledger/busy.py``). Returns how many counted."""
        with self.tx(s, changes_state=False) as s:
            return sum(busy.record(s, w, a, b, f, src) for w, a, b, f, src in samples)

    def prune_usage_history(self, before: float, s: Session | None = None) -> int:
        """Drop hourly usage rollups and busy figures older than ``before`` (retention)."""
        with self.tx(s, changes_state=False) as s:
            return busy.prune(s, before)

    # ------------------------------------------------------------ audit and notices
    def record_decision(self, *, now: float, kind: str, workload: str | None = None,
                        actor: str = "scheduler", reason: str = "", detail: dict | None = None,
                        cycle: int = 0, s: Session | None = None) -> None:
        with self.tx(s) as s:
            s.add(DecisionRow(at=now, cycle=cycle, kind=kind, workload=workload, actor=actor,
                              reason=reason, detail=detail or {}))

    def decisions(self, *, kind: str | None = None, workloads: list[str] | None = None,
                  limit: int = 200) -> list[DecisionRow]:
        with self.ro() as s:
            q = select(DecisionRow)
            if kind is not None:
                q = q.where(DecisionRow.kind == kind)
            if workloads is not None:
                q = q.where(DecisionRow.workload.in_(workloads))
            return list(s.scalars(q.order_by(DecisionRow.id.desc()).limit(limit)))

    def idle_running(self) -> set[str]:
        """Running workloads reported idle since they (last) started."""
        with self.ro() as s:
            q = (select(DecisionRow.workload)
                 .join(WorkloadRow, DecisionRow.workload == WorkloadRow.id)
                 .where(DecisionRow.kind == "idle", WorkloadRow.state == "running",
                        DecisionRow.at >= WorkloadRow.started_at))
            return {w for (w,) in s.execute(q)}

    def running_marks(self) -> tuple[set[str], set[str]]:
        """:meth:`idle_running` and :meth:`stop_requested_running` in one read."""
        with self.ro() as s:
            q = (select(DecisionRow.workload, DecisionRow.kind)
                 .join(WorkloadRow, DecisionRow.workload == WorkloadRow.id)
                 .where(DecisionRow.kind.in_(("idle", "preempt-requested")),
                        WorkloadRow.state == "running",
                        DecisionRow.at >= WorkloadRow.started_at))
            idle: set[str] = set()
            stopping: set[str] = set()
            for w, kind in s.execute(q):
                (idle if kind == "idle" else stopping).add(w)
            return idle, stopping

    def stop_requested_running(self) -> set[str]:
        """Running workloads asked to stop (``preempt-requested``) since they (last) started:
        they still hold their slice until their holder reports them gone."""
        with self.ro() as s:
            q = (select(DecisionRow.workload)
                 .join(WorkloadRow, DecisionRow.workload == WorkloadRow.id)
                 .where(DecisionRow.kind == "preempt-requested", WorkloadRow.state == "running",
                        DecisionRow.at >= WorkloadRow.started_at))
            return {w for (w,) in s.execute(q)}

    def notices_for(self, user: str, limit: int = 100) -> list[tuple[DecisionRow, WorkloadRow]]:
        with self.ro() as s:
            q = (select(DecisionRow, WorkloadRow)
                 .join(WorkloadRow, DecisionRow.workload == WorkloadRow.id)
                 .where(DecisionRow.kind.in_(("preempt", "idle", "requeue", "hibernate",
                                             "snapshot_lost", "timeout", "cancel",
                                             "restore", "preempt-warning")),
                        WorkloadRow.user == user)
                 .order_by(DecisionRow.id.desc()).limit(limit))
            return [(d, w) for d, w in s.execute(q)]

    def node_notes(self, nodes: Iterable[str]) -> dict[str, str]:
        """The admins' note on each of ``nodes`` that has one (why it is drained)."""
        with self.ro() as s:
            rows = s.execute(select(NodeHealthRow.node, NodeHealthRow.reason)
                             .where(NodeHealthRow.node.in_(list(nodes))))
            return {n: r for n, r in rows if r}

    # ------------------------------------------------------------ service state
    def get_state(self, key: str) -> str | None:
        with self.ro() as s:
            row = s.get(ServiceStateRow, key)
            return row.value if row else None

    def set_state(self, key: str, value: str, s: Session | None = None) -> None:
        with self.tx(s) as s:
            row = s.get(ServiceStateRow, key)
            if row is None:
                s.add(ServiceStateRow(key=key, value=value))
            else:
                row.value = value
