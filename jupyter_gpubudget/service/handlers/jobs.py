"""Batch jobs: list, submit, cancel, output."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy.exc import DBAPIError

from ..auth import SCOPE_SUBMIT, needs_scope
from ..base import ApiError, BaseHandler
from ..dependencies import off_peak_start, resolve_after
from ..state import request_to_dict
from ..validate import check_offered, parse_job
from ..views import array_json, workload_json


class JobsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        states = self.query_states()
        rows = await self.db(lambda: self.svc.ledger.workloads(user=c.name, states=states))
        rows = [r for r in rows if r.kind in ("batch", "debug") and r.backend != "external"]
        now, view = self.svc.clock(), self.svc.loop.view
        # a job array is one row, with its tasks' counts per state
        arrays: dict[str, list] = {}
        for r in rows:
            if r.array_id is not None:
                arrays.setdefault(r.array_id, []).append(r)

        def build() -> list[dict]:  # (a predicted start may replay the lazy forecast)
            out = []
            for r in rows:
                if r.array_id is None:
                    out.append(workload_json(r, view, now))
                elif arrays[r.array_id][0] is r:
                    tasks = sorted(arrays[r.array_id], key=lambda t: t.array_index or 0)
                    out.append(array_json(r.array_id, tasks, view, now))
            return out

        self.send({"jobs": await self.db(build)})

    @needs_scope(SCOPE_SUBMIT)
    async def post(self) -> None:
        c = await self.caller()
        job = parse_job(self.body())
        tree = self.tree
        if job["project"] not in tree:
            raise ApiError(400, f"project: no project {job['project']!r}", "project")
        if not tree.is_project(job["project"]):
            raise ApiError(400, f"project: {job['project']!r} is a program; jobs charge a "
                                "project (a leaf account)", "project")
        c.require_submit(tree, job["project"])
        check_offered(self.svc.inventory, job["request"])
        backend = self.svc.backend
        refused = backend.check_user(c.name)
        if refused:
            raise ApiError(403, f"user: {refused}", "user")
        try:
            job["command"] = backend.resolve_command(job["command"])
        except ValueError as e:
            field = getattr(e, "field", "command")
            raise ApiError(400, f"{field}: {getattr(e, 'message', e)}", field) from None
        refused = backend.check_command(job["command"])
        if refused:
            raise ApiError(400, f"command: {refused}", "command")
        now = self.svc.clock()
        not_before = off_peak_start(self.svc.policy().off_peak, job["start"], now)

        def apply(s):  # noqa: ANN001, ANN202
            with self.svc.ledger.tx(s) as s:  # all of an array's tasks, or none
                return submit(s)

        def submit(s):  # noqa: ANN001, ANN202
            after = None
            if job["after"] is not None:  # resolved in the write's transaction
                refs, how = job["after"]
                after = (resolve_after(self.svc.ledger, c.name, refs, job["name"], s), how)

            def one(env: dict, **kw):  # noqa: ANN003, ANN202
                return self.svc.ledger.submit(
                    project=job["project"], user=c.name, kind=job["kind"], now=now,
                    request=request_to_dict(job["request"]), command=job["command"],
                    env=env, min_runtime=job["min_runtime"], resumable=job["resumable"],
                    time_limit=job["time_limit"], backend=self.svc.backend.name,
                    name=job["name"], checkpoint_interval=job["checkpoint_interval"],
                    cluster=job["request"].cluster, after=after, not_before=not_before,
                    max_pending=self.svc.policy().max_pending_per_user, s=s, **kw)

            if job["array"] is None:
                return 201, workload_json(one(job["env"]), self.svc.loop.view, now)
            # a job array: one workload per task, ``<array>_<index>``, all or none
            aid = uuid.uuid4().hex[:16]
            tasks = [one({**job["env"], "GPUBUDGET_ARRAY_INDEX": str(i),
                          "GPUBUDGET_ARRAY_ID": aid}, workload_id=f"{aid}_{i}",
                         array=(aid, i, job["max_running"]))
                     for i in job["array"]]
            return 201, array_json(aid, tasks, self.svc.loop.view, now)

        key = self.idem_key(c)
        try:
            if key is None:
                status, body = await self.db(apply, None)
            else:
                status, body = await self.db(self.idempotent, key, apply, now)
        except DBAPIError as e:
            raise self.write_lost(e) from None
        self.svc.kick()
        self.send(body, status)


    def write_lost(self, e: DBAPIError) -> Exception:
        """The database ended the write's transaction under it — nothing was written (it
        never committed). The commonest cause: this replica was paused (or cut off) with the
        transaction open, PostgreSQL ended it (``idle_in_transaction_session_timeout``) and
        another replica took over. 503, as a write to a standby is: ``not_leader`` when this
        replica no longer leads, else ``ledger unavailable``; retry either way."""
        reason = str(getattr(e, "orig", None) or e).splitlines()[0][:300]
        if not self.svc.is_leader:
            return self.svc.not_leader()
        self.svc.ledger_failed(reason)
        return ApiError(503, f"ledger unavailable: {reason}", retry_after=5)


class JobHandler(BaseHandler):
    @needs_scope(SCOPE_SUBMIT)
    async def delete(self, wid: str) -> None:
        c = await self.caller()
        row = await self.db(self.svc.ledger.get, wid)
        if row is None:
            tasks = await self.db(lambda: self.svc.ledger.array_tasks(wid))
            if tasks:  # a job array: cancel every task still pending or running
                await self.cancel_array(c, wid, tasks)
                return
            raise ApiError(404, f"no workload {wid!r}")
        c.require_change_workload(row.user)
        if row.backend == "external":
            raise ApiError(409, "this workload is run by an external backend; stop it there")
        row = await self.db(self.svc.loop.cancel, wid, c.name)
        self.svc.kick()
        self.send(workload_json(row, self.svc.loop.view, self.svc.clock()))

    async def cancel_array(self, c, aid: str, tasks: list) -> None:  # noqa: ANN001
        for t in tasks:
            c.require_change_workload(t.user)
        for t in tasks:
            if t.state in ("pending", "running") and t.backend != "external":
                await self.db(self.svc.loop.cancel, t.id, c.name)
        self.svc.kick()
        tasks = await self.db(lambda: self.svc.ledger.array_tasks(aid))
        self.send(array_json(aid, tasks, self.svc.loop.view, self.svc.clock()))


LOG_LIMIT = 64 * 1024  # bytes of output per request by default
LOG_LIMIT_MAX = 1024 * 1024


def utf8_cut(data: bytes, at_start: bool, at_end: bool) -> tuple[int, int]:
    """``(skip, keep)``: drop a character cut in half at the start (unless the chunk starts
    the log) and at the end (unless it ends the log), so a log read in pieces decodes
    exactly as the whole."""
    skip = 0
    if not at_start:
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
    keep = len(data)
    if not at_end:
        for back in range(1, min(4, len(data) - skip) + 1):
            b = data[keep - back]
            if b & 0xC0 == 0x80:
                continue  # a continuation byte: look further back for the lead byte
            if b >= 0xC0:  # a lead byte: is its character complete?
                need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
                if back < need:
                    keep -= back
            break
    return skip, keep


class JobLogHandler(BaseHandler):
    """``GET /jobs/{id}/log[?offset=N][&limit=B][&attempt=A]``: a job's output (stdout and
    stderr) as the backend kept it. Without ``offset``: the last ``limit`` bytes; with it:
    from that byte on (``next_offset`` is where to continue, as ``gpubudget logs --follow``
    does). ``truncated``: earlier output is left out."""

    def _int(self, name: str, default: int | None, lo: int, hi: int) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        try:
            v = int(raw)
        except ValueError:
            raise ApiError(400, f"{name}: expected a whole number, got {raw[:40]!r}",
                           name) from None
        if not lo <= v <= hi:
            raise ApiError(400, f"{name}: must be between {lo} and {hi}", name)
        return v

    async def get(self, wid: str) -> None:
        c = await self.caller()
        row = await self.db(self.svc.ledger.get, wid)
        if row is None or row.kind not in ("batch", "debug"):
            raise ApiError(404, f"no job {wid!r}")
        c.require_see_workload(row.user)
        offset = self._int("offset", None, 0, 2**62)
        limit = self._int("limit", LOG_LIMIT, 1, LOG_LIMIT_MAX)
        attempt = self._int("attempt", None, 1, 1_000_000)
        assert limit is not None
        backend = self.svc.backend
        if row.backend != backend.name:
            raise ApiError(404, f"job {wid} is run by the {row.backend!r} backend; its output "
                                "is kept there")
        charges = await self.db(lambda: self.svc.ledger.charges(workload=wid))
        attempts = sorted({ch.seq for ch in charges})
        if attempt is None:
            attempt = attempts[-1] if attempts else 0
        elif attempt not in attempts:
            raise ApiError(404, f"job {wid} has no attempt {attempt} (attempts: "
                                f"{', '.join(map(str, attempts)) or 'none yet'})", "attempt")
        if attempt:
            start = offset if offset is not None else -limit
            try:
                chunk = await asyncio.get_running_loop().run_in_executor(
                    self.svc.db_pool, backend.read_log, wid, attempt, start, limit)
            except OSError as e:
                raise ApiError(409, f"job {wid}: {e}") from None
            if chunk is None:
                raise ApiError(404, f"the {backend.name!r} backend keeps no output of job "
                                    f"{wid}")
            data, first, size = chunk.data, chunk.offset, chunk.size
        else:  # still queued: no output yet
            data, first, size = b"", 0, 0
        skip, keep = utf8_cut(data, first == 0, first + len(data) >= size)
        text = data[skip:keep].decode("utf-8", errors="replace")
        self.send({"id": wid, "attempt": attempt, "offset": first + skip,
                   "next_offset": first + keep, "size": size, "text": text,
                   "truncated": first + skip > 0, "state": row.state})


API_ROUTES = [
    ("/jobs", JobsHandler),
    (r"/jobs/([^/]+)", JobHandler),
    (r"/jobs/([^/]+)/log", JobLogHandler),
]
