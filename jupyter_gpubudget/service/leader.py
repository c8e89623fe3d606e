"""Which of several service replicas leads: a lease row with a fencing token.

Any number of service processes may share one PostgreSQL ledger; exactly one leads (runs the
scheduling loop, applies decisions, takes writes) and the others stand by (answer reads,
refuse writes with ``not_leader`` and the leader's URL). No coordination service: the lease
is one row of the ledger (``service_leader``, id 1):

- ``holder`` (a random id per process), ``url`` (where it answers), ``token`` (the fencing
  token, incremented on every takeover), ``expires_at`` — from the database's clock
  (``now()``), so the replicas' own clocks do not matter.
- A replica takes the lease when it is free, expired or held under its own ``holder`` id
  (the same replica restarted after a crash: it need not wait for its old lease, which is
  fenced off by the new token), in one conditional statement
  (``INSERT ... ON CONFLICT DO UPDATE ... WHERE expired``): two replicas cannot both win.
  The leader renews it every ``renew_interval`` seconds; one that cannot reach the database
  steps down when its lease ends by its own monotonic clock (started before the renewal
  was sent, so it never outlives the database's view of the lease).
- One clock: charges, protection and decisions are timed by the replica's own clock, the
  lease by the database's. Each tick measures the replica's offset from the database's
  clock (half the round trip allowed); a replica more than ``max_clock_offset`` seconds
  off does not take the lease, and a leader that drifts that far gives it up at once —
  saying why in its log and ``/healthz`` — so no replica charges by a clock the others
  do not share.
- Fencing: every write transaction of the leader first reads the lease row ``FOR SHARE`` and
  checks the token is still its own (:meth:`Lease.check`). A takeover's update of that row
  waits for such a transaction to end, and every transaction after it sees the new token:
  a paused old leader that wakes up cannot apply a decision (:class:`NotLeader`), and steps
  down. The node's launcher is fenced with the same token (``LocalBackend.fence``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

#: the database's clock, in epoch seconds (PostgreSQL)
_NOW = "extract(epoch from now())"

_TAKE = text(f"""
INSERT INTO service_leader (id, holder, url, token, acquired_at, expires_at)
VALUES (1, :holder, :url, 1, {_NOW}, {_NOW} + :ttl)
ON CONFLICT (id) DO UPDATE SET
  token = CASE WHEN service_leader.holder = :holder AND service_leader.token = :mine
               THEN service_leader.token ELSE service_leader.token + 1 END,
  acquired_at = CASE WHEN service_leader.holder = :holder AND service_leader.token = :mine
                     THEN service_leader.acquired_at ELSE {_NOW} END,
  holder = :holder, url = :url, expires_at = {_NOW} + :ttl
WHERE service_leader.holder = :holder OR service_leader.expires_at < {_NOW}
RETURNING token
""")

_RELEASE = text(f"""
UPDATE service_leader SET expires_at = {_NOW} - 1
WHERE id = 1 AND holder = :holder AND token = :mine
""")

_READ = text(f"SELECT holder, url, token, expires_at - {_NOW} FROM service_leader WHERE id = 1")
#: the database's clock now (not at the transaction's start), for the replica's offset
_CLOCK = text("SELECT extract(epoch from clock_timestamp())")
_FENCE = text("SELECT token FROM service_leader WHERE id = 1 FOR SHARE")


class NotLeader(Exception):
    """This replica does not lead (any more): a write is refused, changing nothing.
    ``leader`` is the URL of the replica that leads, when known."""

    def __init__(self, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.leader = leader


@dataclass
class Holder:
    """The lease as last read: who leads, where, with which token, seconds left."""

    holder: str
    url: str
    token: int
    left: float


class Lease:
    """One replica's side of the lease. :meth:`tick` (on its own thread, every
    ``renew_interval`` s) takes or renews it; ``on_change(token or None)`` is called from
    that thread when this replica becomes leader (its new token) or stops leading (None)."""

    def __init__(self, engine: Engine, url: str = "", ttl: float = 8.0,
                 renew_interval: float = 2.0, holder: str | None = None,
                 on_change: Callable[[int | None], None] | None = None,
                 log: logging.Logger | None = None,
                 clock: Callable[[], float] = time.time,
                 max_clock_offset: float = 1.0) -> None:
        if not 0 < renew_interval < ttl:
            raise ValueError(f"renew_interval ({renew_interval}) must be below the lease "
                             f"time ({ttl})")
        self.engine = engine
        self.url = url
        self.ttl = float(ttl)
        self.renew_interval = float(renew_interval)
        self.holder = holder or f"{uuid.uuid4().hex[:12]}"
        self.on_change = on_change
        self.log = log or logging.getLogger("gpubudget.leader")
        self.token: int | None = None  # ours while we lead
        self.valid_until = 0.0  # time.monotonic() when our lease ends at the latest
        self.leader: Holder | None = None  # who leads, as last read
        self.last_ok: float | None = None  # time.monotonic() of the last tick that got through
        #: the replica's clock (what it charges by) and how far it may be from the database's
        self.clock = clock
        self.max_clock_offset = float(max_clock_offset)
        #: seconds the replica's clock is ahead of the database's (negative: behind), as
        #: last measured; and why it may not lead (None: it may)
        self.clock_offset: float | None = None
        self.clock_problem: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- state
    @property
    def is_leader(self) -> bool:
        return self.token is not None and time.monotonic() < self.valid_until

    def leader_url(self) -> str | None:
        if self.is_leader:
            return self.url or None
        return self.leader.url if self.leader is not None and self.leader.left > 0 else None

    def _set(self, token: int | None, why: str) -> None:
        with self._lock:
            old, self.token = self.token, token
            if token is None:
                self.valid_until = 0.0
        if old != token:
            if token is None:
                self.log.warning("stepped down (token %s): %s", old, why)
            else:
                self.log.warning("leading with fencing token %d (%s)", token, why)
            if self.on_change is not None:
                self.on_change(token)

    # ---------------------------------------------------------------- the lease
    def tick(self) -> int | None:
        """Take or renew the lease once; the token while this replica leads, else None.
        A database error keeps the lease until its local end (then steps down)."""
        sent = time.monotonic()
        mine = self.token if self.token is not None else -1
        skewed = None
        try:
            with self.engine.begin() as c:
                c.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
                skewed = self._measure_clock(c)
                got = None
                if skewed is None:
                    got = c.execute(_TAKE, {"holder": self.holder, "url": self.url,
                                            "ttl": self.ttl, "mine": mine}).scalar()
                elif self.token is not None:  # give it up now: a standby takes over at once
                    c.execute(_RELEASE, {"holder": self.holder, "mine": self.token})
                row = c.execute(_READ).first()
        except Exception as e:  # noqa: BLE001 - unreachable, locked: decide by the clock
            if self.token is not None and time.monotonic() >= self.valid_until:
                self._set(None, f"the lease ended without renewal ({e.__class__.__name__})")
            else:
                self.log.info("lease not renewed: %s", str(e).splitlines()[0][:200])
            return self.token if self.is_leader else None
        self.last_ok = time.monotonic()
        if row is not None:
            self.leader = Holder(row[0], row[1], int(row[2]), float(row[3]))
        if skewed is not None:
            self._set(None, skewed)
            return None
        if got is None:
            self._set(None, f"{self.leader.holder if self.leader else 'another replica'} "
                            "holds the lease")
            return None
        with self._lock:
            self.valid_until = sent + self.ttl - 0.5
        self._set(int(got), "took the lease" if mine != int(got) else "renewed")
        return int(got)

    def _measure_clock(self, c) -> str | None:  # noqa: ANN001 - a connection
        """Measure this replica's clock against the database's; why it may not lead when it
        is more than ``max_clock_offset`` s off (logged when that changes), else None."""
        before = self.clock()
        db = float(c.execute(_CLOCK).scalar())
        after = self.clock()
        offset = (before + after) / 2 - db
        self.clock_offset = offset
        if abs(offset) - abs(after - before) / 2 <= self.max_clock_offset:
            if self.clock_problem is not None:
                self.log.warning("clock back within %g s of the database's (%+.3f s): this "
                                 "replica may lead again", self.max_clock_offset, offset)
            self.clock_problem = None
            return None
        problem = (f"this replica's clock is {abs(offset):.1f} s "
                   f"{'ahead of' if offset > 0 else 'behind'} the ledger database's (more "
                   f"than max_clock_offset, {self.max_clock_offset:g} s): it does not lead, "
                   "since charges and protection are timed by its clock; fix its time "
                   "synchronisation (NTP)")
        if self.clock_problem is None:
            self.log.error("%s", problem)
        self.clock_problem = problem
        return problem

    def release(self) -> None:
        """Give the lease up at once (a clean shutdown): a standby takes over at its next
        tick instead of waiting for the lease to run out."""
        mine = self.token
        self._set(None, "shutting down")
        if mine is None:
            return
        try:
            with self.engine.begin() as c:
                c.execute(_RELEASE, {"holder": self.holder, "mine": mine})
        except Exception as e:  # noqa: BLE001 - it runs out by itself
            self.log.info("lease not released (it runs out): %s", e)

    def lost(self, why: str) -> None:
        """A write found the token changed: step down now."""
        self._set(None, why)

    # ---------------------------------------------------------------- fencing
    def check(self, s: Session) -> None:
        """First statement of every write transaction: the lease row still carries this
        replica's token (read ``FOR SHARE``: a takeover waits for this transaction to end).
        Raises :class:`NotLeader` — and steps down — when it does not."""
        mine = self.token
        if mine is None or time.monotonic() >= self.valid_until:
            raise NotLeader("this gpubudget service replica does not lead (standby)",
                            self.leader_url())
        current = s.execute(_FENCE).scalar()
        if current != mine:
            self.lost(f"fencing token {mine} is stale (the lease carries {current})")
            raise NotLeader(f"this replica's fencing token {mine} is stale: another "
                            "replica took over", self.leader_url())

    # ---------------------------------------------------------------- thread
    def start(self) -> None:
        """Tick every ``renew_interval`` s on a daemon thread until :meth:`stop`."""
        def run() -> None:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - never let the lease thread die
                    self.log.exception("lease tick failed")
                self._stop.wait(max(0.05, self.renew_interval - (time.monotonic() - t0)))

        self._thread = threading.Thread(target=run, name="gpubudget-lease", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if release:
            self.release()
