"""The OpenAPI 3.0 document the service serves at /api/v1/openapi.json."""

from __future__ import annotations

from typing import Any

from jupyter_gpubudget.ledger.store import STATES

NAME = {"type": "string", "minLength": 1}
WORKLOAD_ID = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$"}
NUM = {"type": "number"}
NULL_NUM = {"type": "number", "nullable": True}

ERROR = {"type": "object", "required": ["status", "message"],
         "properties": {"status": {"type": "integer"}, "message": {"type": "string"},
                        "field": {"type": "string"}}}

WORKLOAD = {"type": "object", "properties": {
    "id": {"type": "string"}, "name": {"type": "string"}, "project": {"type": "string"},
    "user": {"type": "string"}, "kind": {"type": "string"},
    "state": {"type": "string", "enum": list(STATES)},
    "request": {"type": "object"},
    "placement": {"type": "array", "nullable": True, "items": {"type": "object"}},
    "submitted_at": NUM, "started_at": NULL_NUM, "ended_at": NULL_NUM,
    "backed": {"type": "boolean"}, "protected_until": NULL_NUM,
    "protected_left_s": {**NULL_NUM, "description": "Protected time left (running, backed)"},
    "queue_position": {"type": "integer", "nullable": True},
    "predicted_start": {**NULL_NUM, "description": "Reserved start time, when reserved"},
    "min_runtime": NUM, "resumable": {"type": "boolean"}, "time_limit": NULL_NUM,
    "preemptions": {"type": "integer"}, "exit_code": {"type": "integer", "nullable": True},
    "reason": {"type": "string"}, "backend": {"type": "string"},
    "preemption_forecast": {
        "type": "object", "nullable": True,
        "description": "Running work only: whether the scheduler is likely to preempt it "
                       "within the outlook's horizon given the work queued now, about when "
                       "(at, with at_local/at_text), for which pending work and why",
        "properties": {"likely": {"type": "boolean"}, "at": NULL_NUM,
                       "at_local": {"type": "string", "nullable": True},
                       "at_text": {"type": "string", "nullable": True},
                       "for_workload": {"type": "string", "nullable": True},
                       "for_project": {"type": "string", "nullable": True},
                       "reason": {"type": "string", "nullable": True}}}}}

USAGE_DAILY = {"type": "object", "properties": {
    "account": {"type": "string"}, "tz": {"type": "string"}, "window_s": NUM,
    "days": {"type": "array", "items": {"type": "object", "properties": {
        "date": {"type": "string", "format": "date"}, "start": NUM, "end": NUM,
        "gpu_hours": NUM}}},
    "computed_at": NUM}}

JOB_LOG = {"type": "object", "properties": {
    "id": {"type": "string"}, "attempt": {"type": "integer",
                                          "description": "0: not started yet (no output)"},
    "offset": {"type": "integer", "description": "Byte where the text starts"},
    "next_offset": {"type": "integer", "description": "Ask from here for what follows"},
    "size": {"type": "integer", "description": "Bytes of output so far"},
    "text": {"type": "string"},
    "truncated": {"type": "boolean", "description": "Earlier output is left out"},
    "state": {"type": "string"}}}

LOG_PARAMS = [
    {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer",
     "minimum": 0}, "description": "From this byte on (default: the last `limit` bytes)"},
    {"name": "limit", "in": "query", "required": False, "schema": {
        "type": "integer", "minimum": 1, "maximum": 1048576, "default": 65536}},
    {"name": "attempt", "in": "query", "required": False, "schema": {
        "type": "integer", "minimum": 1}, "description": "Default: the latest"}]

DURATION = {"oneOf": [{"type": "number", "minimum": 0},
                      {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*[smhd]?\s*$"}]}

JOB = {"type": "object", "required": ["command", "project"], "additionalProperties": False,
       "properties": {
           "command": {"oneOf": [{"type": "string", "minLength": 1},
                                 {"type": "array", "minItems": 1, "items": {"type": "string"}}]},
           "project": NAME,
           "gpus": {"type": "integer", "minimum": 0, "maximum": 1024},
           "slice": {"type": "string", "description": "MIG profile ('1g.18gb') or 'mps:<milli>[:<MiB>]'"},
           "min_runtime": DURATION, "time_limit": DURATION, "checkpoint_interval": DURATION,
           "resumable": {"type": "boolean"},
           "name": {"type": "string", "maxLength": 200},
           "kind": {"type": "string", "enum": ["batch", "debug"]},
           "gpu_model": {"type": "string"}, "single_node": {"type": "boolean"},
           "interconnect": {"type": "string", "enum": ["nvlink", "node", "any"]},
           "cluster": {"type": "string", "description": "the named cluster to run on "
                       "(GpuBudgetService.clusters); none: wherever it starts sooner"},
           "env": {"type": "object", "additionalProperties": {"type": "string"}},
           "array": {"oneOf": [{"type": "string", "pattern": r"^[0-9, -]+$"},
                               {"type": "array", "minItems": 1, "maxItems": 10000,
                                "items": {"type": "integer", "minimum": 0,
                                          "maximum": 999999}}],
                     "description": "a job array: one task per index ('0-99', '0-9,20', or "
                     "a list), each with GPUBUDGET_ARRAY_INDEX in its environment"},
           "max_running": {"type": "integer", "minimum": 1, "maximum": 10000,
                           "description": "with array: at most this many tasks run at once"},
           "after": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1,
                                                    "maxItems": 100,
                                                    "items": {"type": "string"}}],
                     "description": "jobs this one runs after: ids, array ids (all their "
                     "tasks) or names of your own jobs"},
           "after_kind": {"type": "string", "enum": ["afterok", "afterany", "afternotok"],
                          "description": "afterok (default): after all succeeded; afterany: "
                          "after all ended; afternotok: after all ended, one not "
                          "successfully"},
           "start": {"type": "string", "enum": ["now", "off-peak"],
                     "description": "now (default); off-peak: wait for the next off-peak "
                     "window (where the policy sets off-peak prices), then be ranked like any "
                     "work"},
           "warn_signal": {"type": "string", "enum": ["USR1", "USR2", "INT", "TERM", "HUP"],
                           "description": "a signal the job's processes get when its likely "
                           "preemption is within the service's notice lead time (none by "
                           "default)"}}}

GRANT_BODY = {"type": "object", "additionalProperties": False, "properties": {
    "grant_hours": {"type": "number", "minimum": 0, "maximum": 1e9},
    "share_pct": {"type": "number", "minimum": 0, "maximum": 100},
    "note": {"type": "string", "maxLength": 2000},
    "requested_by": {"type": "string", "maxLength": 200,
                     "description": "the manager who asked for this change, when an admin or "
                     "another manager of the parent makes (approves) it for them"}}}

MEMBER_LIMIT_BODY = {"type": "object", "additionalProperties": False, "properties": {
    "gpu_hours": {"type": "number", "minimum": 0, "maximum": 1e9, "nullable": True,
                  "description": "GPU-hours per usage window the project backs of the member"},
    "gpus": {"type": "number", "minimum": 0, "maximum": 1e6, "nullable": True,
             "description": "GPUs (slice fractions) of the member's backed work at once"},
    "note": {"type": "string", "maxLength": 2000}}}

EVENT = {"type": "object", "required": ["workload", "event", "at"], "additionalProperties": False,
         "properties": {
             "workload": WORKLOAD_ID, "event": {"type": "string", "enum": ["start", "checkpoint", "stop"]},
             "at": {"type": "number", "minimum": 0}, "project": NAME, "user": NAME,
             "milli": {"type": "integer", "minimum": 0, "maximum": 1000000},
             "kind": {"type": "string", "enum": ["interactive", "batch", "debug"]},
             "placement": {"type": "array", "items": {"type": "object"}}}}


def _resp(desc: str, schema: dict | None = None) -> dict:
    r: dict[str, Any] = {"description": desc}
    r["content"] = {"application/json": {"schema": schema or {"type": "object"}}}
    return r


def _op(summary: str, ok: dict, *, auth: bool = True, params: list | None = None,
        body: dict | None = None, ok_code: str = "200", extra: dict | None = None) -> dict:
    op: dict[str, Any] = {"summary": summary, "responses": {ok_code: ok}}
    if auth:
        op["security"] = [{"hubToken": []}]
        op["responses"]["403"] = _resp("Missing/invalid/expired token, or not allowed", ERROR)
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": body}}}
        op["responses"]["400"] = _resp("Malformed request (the field is named)", ERROR)
        op["responses"]["413"] = _resp("Request body too large (GpuBudgetService."
                                       "max_body_bytes)", ERROR)
    for code, desc in (extra or {}).items():
        op["responses"][code] = _resp(desc, ERROR)
    return op


def _path_param(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": NAME}


STATE_Q = {"name": "state", "in": "query", "required": False,
           "description": "Comma-separated states to include",
           "schema": {"type": "string"}}
IDEM = {"name": "Idempotency-Key", "in": "header", "required": False,
        "description": "Apply the request at most once per key", "schema": {"type": "string"}}


def openapi_document(api_prefix: str) -> dict:
    acct = [_path_param("name")]
    nf = {"404": "No such account"}
    paths = {
        "/healthz": {"get": _op("Liveness and last cycle", _resp("OK"), auth=False)},
        "/leader": {"get": _op("Which replica leads: 200 on the leader, 503 on a standby "
                               "(a readiness probe)", _resp("The leader"), auth=False)},
        "/openapi.json": {"get": _op("This document", _resp("OpenAPI 3.0"), auth=False)},
        "/accounts": {"get": _op("Accounts the caller may see", _resp("Accounts"))},
        "/accounts/{name}": {"get": _op("One account", _resp("Account"), params=acct, extra=nf)},
        "/accounts/{name}/grants": {"get": _op("Grant versions (who, when)", _resp("History"),
                                               params=acct, extra=nf)},
        "/accounts/{name}/grant": {"put": _op(
            "Change a grant (admins, the account's managers)", _resp("New grant version"),
            params=acct, body=GRANT_BODY, extra=nf)},
        "/accounts/{name}/member_limits": {"get": _op(
            "Members' limits in a project (GPU-hours per window, GPUs running at once)",
            _resp("Limits per member"), params=acct, extra=nf)},
        "/accounts/{name}/member_limits/{user}": {
            "put": _op("Set a member's limit in a project (admins, the project's managers and "
                       "those above it); past it the member's work runs unbacked",
                       _resp("The limit"), params=[*acct, _path_param("user")],
                       body=MEMBER_LIMIT_BODY, extra=nf),
            "delete": _op("Clear a member's limit in a project", _resp("Cleared"),
                          params=[*acct, _path_param("user")],
                          extra={**nf, "400": "Not a project, or not a member"})},
        "/accounts/{name}/usage": {"get": _op("Usage and standing", _resp("Usage"),
                                              params=acct, extra=nf)},
        "/accounts/{name}/usage/daily": {"get": _op(
            "GPU-hours per day over the usage window (the account and everything below it)",
            _resp("Days, oldest first; the last is today so far", USAGE_DAILY),
            params=[*acct, {"name": "tz", "in": "query", "required": False,
                            "description": "IANA time zone of the days (default UTC)",
                            "schema": {"type": "string", "example": "Europe/Berlin"}}],
            extra={**nf, "400": "Unknown time zone"})},
        "/workloads/me": {"get": _op("My workloads", _resp("Workloads", {
            "type": "object", "properties": {"user": {"type": "string"}, "workloads": {
                "type": "array", "items": WORKLOAD}}}), params=[STATE_Q],
            extra={"400": "Unknown state"})},
        "/workloads/me/ended": {"get": _op(
            "My most recently ended workloads, newest first, with what each cost its project",
            _resp("Ended workloads", {
                "type": "object", "properties": {"user": {"type": "string"}, "workloads": {
                    "type": "array", "items": {"allOf": [WORKLOAD, {
                        "type": "object", "properties": {
                            "charged_gpu_hours": {"type": "number", "description":
                                                  "slice fraction x time running"},
                            "ran_s": {"type": "number"}}}]}}}}),
            params=[{"name": "limit", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5}},
                    {"name": "user", "in": "query", "required": False, "schema": NAME,
                     "description": "another user's (admins only)"}],
            extra={"400": "Bad limit", "403": "Another user's work, not an admin"})},
        "/workloads/{name}": {"get": _op("One of my workloads", _resp("Workload", WORKLOAD),
                                         params=[_path_param("name")],
                                         extra={"404": "No such workload"})},
        "/queue": {"get": _op("Pending work in rank order (others' entries redacted)",
                              _resp("Queue"))},
        "/jobs": {
            "get": _op("My batch jobs", _resp("Jobs"), params=[STATE_Q],
                       extra={"400": "Unknown state"}),
            "post": _op("Submit a batch job", _resp("The job", WORKLOAD), body=JOB,
                        params=[IDEM], ok_code="201")},
        "/jobs/{name}": {"delete": _op("Cancel a job", _resp("The job", WORKLOAD),
                                       params=[_path_param("name")],
                                       extra={"404": "No such job", "409": "Already ended"})},
        "/jobs/{name}/log": {"get": _op(
            "A job's output (owner or admin)", _resp("Part of the output", JOB_LOG),
            params=[_path_param("name"), *LOG_PARAMS],
            extra={"404": "No such job, attempt or kept output", "400": "Bad offset or limit",
                   "409": "The output cannot be read"})},
        "/notices": {"get": _op("Preemption notices for my workloads, in words (title, body, "
                                "details)", _resp("Notices"))},
        "/notices/settings": {
            "get": _op("Where my notices go besides JupyterLab, and failed deliveries",
                       _resp("Notice settings")),
            "put": _op("Send my notices to a webhook and / or an e-mail address",
                       _resp("Notice settings"), body={
                           "type": "object", "additionalProperties": False, "properties": {
                               "webhook": {"type": ["string", "null"], "format": "uri"},
                               "email": {"type": ["string", "null"], "format": "email"}}}),
            "delete": _op("Notices only in JupyterLab again", _resp("Notice settings"))},
        "/usage/events": {"post": _op(
            "Usage reported by an external backend (admins)", _resp("Applied"), body=EVENT,
            params=[IDEM], extra={"404": "No such workload", "409": "Wrong state"})},
    }
    paths.update(session_paths())
    paths.update(operator_paths())
    paths.update(snapshot_paths())
    paths.update(reservation_paths())
    paths.update(mine_paths())
    return {
        "openapi": "3.0.3",
        "info": {"title": "jupyter-gpubudget service", "version": "1",
                 "description": "GPU budgets: accounts, grants, usage, workloads, batch jobs."},
        "servers": [{"url": api_prefix}],
        "components": {"securitySchemes": {"hubToken": {
            "type": "apiKey", "in": "header", "name": "Authorization",
            "description": "'token <JupyterHub API token>'"}},
            "schemas": {"Error": ERROR, "Workload": WORKLOAD, "Job": JOB}},
        "paths": paths,
    }


SNAPSHOT = {"type": "object", "properties": {
    "id": {"type": "string"}, "session": {"type": "string"}, "project": {"type": "string"},
    "created_at": NUM, "method": {"type": "string", "description":
                                  "criu, namespace, criu+namespace or none"},
    "status": {"type": "string", "enum": ["ok", "bad", "deleted"]},
    "problem": {"type": "string"}, "stored_bytes": {"type": "integer"},
    "raw_bytes": {"type": "integer"}, "seconds": NUM,
    "reason": {"type": "string", "enum": ["user", "preempt", "hibernate"]},
    "kernels": {"type": "array", "items": {"type": "object"}},
    "saved": {"type": "integer"}, "count": {"type": "integer"}}}


def snapshot_paths() -> dict:
    """Snapshots (handlers/snapshots.py)."""
    snap_id = [_path_param("id")]
    sid = [_path_param("id")]
    listed = _resp("Snapshots", {"type": "object", "properties": {
        "snapshots": {"type": "array", "items": SNAPSHOT}}})
    nf = {"404": "No such snapshot"}
    return {
        "/snapshots": {"get": _op("My snapshots (admins: ?user=, or all)", listed, params=[
            {"name": "user", "in": "query", "required": False, "schema": NAME}])},
        "/snapshots/{id}": {
            "get": _op("One snapshot", _resp("Snapshot", SNAPSHOT), params=snap_id, extra=nf),
            "put": _op("A user's server records a snapshot it took", _resp("Snapshot",
                       SNAPSHOT), params=snap_id, body={"type": "object"},
                       extra={"404": "No such session"})},
        "/snapshots/{id}/bad": {"post": _op(
            "A user's server found the snapshot does not verify", _resp("Snapshot", SNAPSHOT),
            params=snap_id, body={"type": "object", "required": ["problem"], "properties": {
                "problem": {"type": "string"}}}, extra=nf)},
        "/snapshots/{id}/restore": {"post": _op(
            "Restore it: into the running server, else by starting the server from it",
            _resp("Accepted"), params=snap_id, ok_code="202",
            extra={**nf, "409": "Not usable, or the server is queued"})},
        "/sessions/{id}/snapshots": {
            "get": _op("A session's snapshots (and those of sessions it resumed), retention, "
                       "quota, open requests", listed, params=sid,
                       extra={"404": "No such session"}),
            "post": _op("Ask the running server for a snapshot now", _resp("Accepted"),
                        params=sid, ok_code="202",
                        extra={"404": "No such session", "409": "Not running"})},
        "/sessions/{id}/requests/{request}": {
            "get": _op("What became of a snapshot or restore request", _resp("Request"),
                       params=[*sid, _path_param("request")]),
            "post": _op("The request could not be carried out", _resp("Request"),
                        params=[*sid, _path_param("request")], body={"type": "object"})},
        "/sessions/{id}/restored": {"post": _op(
            "A user's server reports what a restore brought back", _resp("Recorded"),
            params=sid, body={"type": "object"}, extra={"404": "No such session"})},
        "/sessions/{id}/lost": {"post": _op(
            "No snapshot could be taken in time: the kernel state is lost", _resp("Recorded"),
            params=sid, body={"type": "object", "required": ["reason"], "properties": {
                "reason": {"type": "string"}, "kernels": {"type": "array"}}},
            extra={"404": "No such session"})},
    }


def session_paths() -> dict:
    """The session endpoints BudgetSpawner uses (handlers/sessions.py)."""
    session = {**WORKLOAD, "properties": {
        **WORKLOAD["properties"],
        "preempt_requested": {"type": "string", "nullable": True,
                              "description": "Why the scheduler wants this session stopped"},
        "idle_reported": {"type": "number", "nullable": True,
                          "description": "When it was reported idle (protection ended)"},
        "charged_gpu_hours": {"type": "number", "description": "GPU-hours charged so far "
                              "(slice fraction × time running, up to now)"},
        "preempt_deadline": {"type": "number", "nullable": True,
                             "description": "When the server will be stopped at the latest "
                                            "after a preemption was asked for"},
        "preempt_stop_at": {"type": "number", "nullable": True,
                            "description": "When the spawner saves the kernels and stops the "
                                           "server: the lab's notice (preempt_notice_time) "
                                           "after the preemption was asked for, or when the "
                                           "owner released it"},
        "free_now": {"type": "array", "description": "Queued: other GPU slices that would "
                     "start at once (largest first)", "items": {"type": "object", "properties": {
                         "key": {"type": "string"}, "label": {"type": "string"},
                         "kind": {"type": "string"}, "fraction": NUM}}},
        "inventory": {"type": "string", "enum": ["declared", "nvml"]},
        "snapshot": {**SNAPSHOT, "nullable": True,
                     "description": "Its newest snapshot (or of a session it resumed)"},
        "snapshot_count": {"type": "integer"},
        "resumes": {"type": "object", "nullable": True, "description":
                    "The session this one resumes and the snapshot it restores"},
        "restored": {"type": "object", "nullable": True, "description":
                     "What its restore brought back: per kernel, everything (CRIU) or the "
                     "variables restored, recomputed and lost (namespace)"},
        "snapshot_lost": {"type": "object", "nullable": True, "description":
                          "Kernel state lost: no snapshot in the grace period (reason, at)"},
        "hibernated": {"type": "object", "nullable": True},
        "snapshot_requests": {"type": "array", "items": {"type": "object"}}}}
    body = {"type": "object", "required": ["user", "project"], "additionalProperties": False,
            "properties": {"user": NAME, "project": NAME,
                           "resumes": {**WORKLOAD_ID, "description": "A session of the same "
                                       "user that ended: this one restores its snapshot"},
                           "restore": {"type": "string", "description": "The snapshot to "
                                       "restore (default: the newest usable one)"},
                           "gpus": {"type": "integer", "minimum": 0, "maximum": 1024},
                           "slice": {"type": "string", "description": "cpu, gpu:N, "
                                     "mig:<profile> or <profile>, mps:<milli>[:<MiB>]"},
                           "gpu_model": {"type": "string"}, "cluster": {"type": "string"},
                           "min_runtime": DURATION,
                           "name": {"type": "string", "maxLength": 200}}}
    sid = [_path_param("id")]
    nf = {"404": "No such session"}
    user_q = {"name": "user", "in": "query", "required": False, "schema": NAME,
              "description": "Act for this user (admins)"}
    return {
        "/sessions/offer": {"get": _op(
            "Projects, slice choices and quotes for a spawn form", _resp("Offer"),
            params=[user_q, {"name": "min_runtime", "in": "query", "required": False,
                             "schema": {"type": "string"}}])},
        "/sessions/quote": {"get": _op(
            "One quote (a project, a slice, a minimum runtime) for the spawn form",
            _resp("Quote"), params=[user_q, {
                "name": "project", "in": "query", "required": True, "schema": NAME}, {
                "name": "slice", "in": "query", "required": False, "schema": {
                    "type": "string", "description": "cpu, gpu:N, mig:<profile>, mps:<milli>"}},
                {"name": "gpus", "in": "query", "required": False, "schema": {
                    "type": "integer", "minimum": 0,
                    "description": "whole GPUs, instead of slice (gpus=2 is slice=gpu:2)"}},
                {"name": "min_runtime", "in": "query", "required": False,
                 "schema": {"type": "string"}}],
            extra={"400": "Bad slice or minimum runtime"})},
        "/sessions": {
            "get": _op("Interactive sessions", _resp("Sessions"), params=[user_q, STATE_Q]),
            "post": _op("Queue an interactive session (BudgetSpawner)", _resp("Session",
                        session), body=body, params=[IDEM], ok_code="201")},
        "/sessions/{id}": {
            "get": _op("One session; ?wait=S long-polls for a state change",
                       _resp("Session", session), params=[*sid, {
                           "name": "wait", "in": "query", "required": False,
                           "schema": {"type": "number", "minimum": 0, "maximum": 30}}],
                       extra=nf),
            "delete": _op("End a session and its charge", _resp("Session", session),
                          params=[*sid, {"name": "reason", "in": "query", "required": False,
                                         "schema": {"type": "string", "enum": sorted(
                                             ["stop", "cull", "preempt", "failed", "timeout",
                                              "hibernate"])}},
                                  {"name": "requeue", "in": "query", "required": False,
                                   "description": "With reason=preempt: queue a session "
                                   "that resumes from this snapshot", "schema": NAME},
                                  {"name": "snapshot", "in": "query", "required": False,
                                   "description": "With reason=hibernate: the snapshot it "
                                   "resumes from", "schema": NAME}],
                          extra={**nf, "409": "The snapshot is not usable"})},
        "/sessions/{id}/heartbeat": {"post": {
            **_op("The server is alive: checkpoint the charge", _resp("Session", session),
                  params=sid, extra={**nf, "400": "Malformed body (the field is named)"}),
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "nullable": True, "properties": {"gpu_utilisation": {
                    "type": "number", "minimum": 0, "maximum": 100,
                    "description": "GPU utilisation of the session's devices (percent, "
                                   "from the hub's NVML sampler)"}}}}}}}},
        "/sessions/{id}/idle": {"post": _op(
            "Report the session idle: notice, protection ends", _resp("Session", session),
            params=sid, body={"type": "object", "properties": {
                "idle_s": {"type": "number", "minimum": 0}, "source": {"type": "string"}}},
            extra={**nf, "409": "Not running"})},
        "/sessions/{id}/history": {"get": _op(
            "The server's history across preemptions: the session and the ones it resumed, "
            "one segment per charge interval (start, end, nodes, placement, gpu_hours, "
            "ended: preempted|hibernated|cancelled|stopped|ended, why), and total_gpu_hours",
            _resp("History", {"type": "object"}), params=sid, extra=nf)},
        "/sessions/{id}/release": {"post": _op(
            "Save and release now: the owner lets the preemption of their session go ahead "
            "now (preempt_stop_at becomes now; the kernels are still saved and restored)",
            _resp("Session", session), params=sid,
            extra={**nf, "409": "Not being preempted"})},
    }


def operator_paths() -> dict:
    """The operator's endpoints (handlers/operator.py; the pages show the same data)."""
    tz = {"name": "tz", "in": "query", "required": False, "schema": {"type": "string"},
          "description": "IANA time zone for the *_local and *_text companions of every time "
                         "(default: the service's)"}
    node = [_path_param("name"), tz]
    health_body = {"type": "object", "required": ["healthy"], "additionalProperties": False,
                   "properties": {"healthy": {"type": "boolean", "description":
                                              "false: drain (nothing new; work leaves as its "
                                              "protection ends); true: return to service"},
                                  "reason": {"type": "string", "maxLength": 500,
                                             "description": "Required to drain"}}}
    node_schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "state": {"type": "string", "enum": [
            "in_service", "draining", "ready_for_repair"]},
        "state_text": {"type": "string"}, "healthy": {"type": "boolean"},
        "reason": {"type": "string"}, "source": {"type": "string"},
        "changed_by": {"type": "string"}, "changed_at": NULL_NUM, "drained_at": NULL_NUM,
        "protected_until": NULL_NUM, "running": {"type": "integer"},
        "gpus": {"type": "array", "items": {"type": "object"}}}}
    q = lambda name, desc, schema=None: {  # noqa: E731
        "name": name, "in": "query", "required": False, "description": desc,
        "schema": schema or {"type": "string"}}
    return {
        "/tree": {"get": _op("The visible account tree: figures, shares of the parent, work "
                             "per kind, grant history, whether the caller may edit",
                             _resp("Tree"), params=[tz], extra={"400": "Bad tz"})},
        "/accounts/{name}/grant/preview": {"post": _op(
            "What a grant change would do (changes nothing): standings and shares before and "
            "after, pending work whose backing changes, and why saving would be refused",
            _resp("Preview"), params=[_path_param("name")], body=GRANT_BODY,
            extra={"404": "No such account"})},
        "/queue/detail": {"get": _op(
            "Pending work in rank order with why it waits; running work with slice, place, "
            "protected-until and cost so far (others' entries redacted)", _resp("Queue"),
            params=[tz, q("project", "Only this account's projects")],
            extra={"400": "Unknown project or bad tz"})},
        "/workloads/{name}/requeue": {"post": _op(
            "Stop a running job and queue it again (admins)", _resp("The job", WORKLOAD),
            params=[_path_param("name"), tz],
            extra={"404": "No such workload", "409": "Not running, or not run here"})},
        "/nodes": {"get": _op("Nodes: GPUs and what runs on them, health and drain state "
                              "(admins: notices of nodes ready for repair)", _resp("Nodes"),
                              params=[tz], extra={"400": "Bad tz"})},
        "/nodes/{name}": {"get": _op("One node", _resp("Node", node_schema), params=node,
                                     extra={"404": "No such node", "400": "Bad tz"})},
        "/nodes/{name}/health": {"put": _op(
            "Drain a node or return it to service (admins); audited", _resp("Node",
                                                                           node_schema),
            params=node, body=health_body, extra={"404": "No such node"})},
        "/decisions": {"get": _op(
            "The audit log, newest first (admins: all; others: their own work and their "
            "accounts' grants)", _resp("Decisions"),
            params=[tz, q("kind", "Comma-separated kinds"), q("workload", "A workload id"),
                    q("actor", "Who decided"), q("q", "Text in the reason or detail"),
                    q("before", "Only decisions with a smaller id (paging)",
                      {"type": "integer"}),
                    q("limit", "At most this many (1..1000)", {"type": "integer"})],
            extra={"400": "Bad filter"})},
        "/audit": {"get": _audit_op(tz, q)},
        "/reports": {"get": _reports_op(tz, q)},
    }


def _reports_op(tz: dict, q: Any) -> dict:
    """``GET /reports`` (handlers/reports.py): where an account subtree's GPU-hours went."""
    num = {"type": ["number", "null"]}
    figs = {"charged_gpu_h": {"type": "number"}, "priced_gpu_h": num, "busy_gpu_h": num,
            "measured_gpu_h": num, "idle_gpu_h": num, "idle_share": num}
    op = _op("Charged (at full price; priced_gpu_h: at their price, off-peak parts at the "
             "policy's factor), busy (null: unknown, nothing measured), idle GPU-hours and grant for "
             "an account subtree over a period, a line per user inside each project, waits "
             "p50/p90 by kind, preemptions suffered and the sessions that held GPUs idle "
             "longest. Admins: any account; managers: the accounts they manage and below; "
             "anyone else: their own projects' totals and their own line only",
             _resp("The report", {"type": "object", "properties": {
                 "account": {"type": "string"}, "from": {"type": "number"},
                 "to": {"type": "number"}, "by": {"type": "string"},
                 "totals": {"type": "object", "properties": figs},
                 "projects": {"type": "array", "items": {"type": "object", "properties": {
                     "project": {"type": "string"}, **figs,
                     "grant_gpu_h": num, "preemptions": {"type": "integer"},
                     "users": {"type": "array", "items": {"type": "object"}}}}},
                 "periods": {"type": "array", "items": {"type": "object"}},
                 "waits": {"type": "object"},
                 "idle_sessions": {"type": "array", "items": {"type": "object"}}}}),
             params=[tz,
                     q("account", "This account and everything below it (required)"),
                     q("from", "First day (2025-03-01) or date and time, in tz"),
                     q("to", "Last day, included (or a date and time: the end), in tz"),
                     q("period", "day, week or month (instead of from/to), holding at"),
                     q("at", "A date within the period (default: today in tz)"),
                     q("by", "day, week (figures per local day or Monday week and project) "
                             "or user (default)"),
                     q("format", "json (default) or csv (every cell that would start a "
                                 "spreadsheet formula is prefixed with ')")],
             extra={"400": "Bad period, zone, account or option (the field is named)"})
    op["responses"]["200"]["content"]["text/csv"] = {"schema": {"type": "string"}}
    return op


def _audit_op(tz: dict, q: Any) -> dict:
    """``GET /audit`` (handlers/audit.py): the administrative part of the audit log."""
    entry = {"type": "object", "properties": {
        "id": {"type": "integer"}, "at": {"type": "number"},
        "at_local": {"type": "string"}, "at_text": {"type": "string"},
        "kind": {"type": "string", "enum": ["grant", "health", "drain", "repair", "undrain",
                                            "cancel", "preempt", "preempt-requested",
                                            "requeue"]},
        "what": {"type": "string"}, "who": {"type": "string"}, "who_text": {"type": "string"},
        "account": {"type": ["string", "null"]}, "workload": {"type": ["string", "null"]},
        "workload_name": {"type": ["string", "null"]}, "user": {"type": ["string", "null"]},
        "node": {"type": ["string", "null"]}, "change": {"type": "string"},
        "why": {"type": "string"}, "detail": {"type": "object"}}}
    when = ("a date (2025-03-01) or date and time (2025-03-01T14:00), in tz unless it has an "
            "offset")
    op = _op("Who changed grants, drained nodes, cancelled, preempted or requeued work, when "
             "and why, newest first. Admins: everything; managers: the accounts they manage "
             "and below, and node changes; anyone else: 403",
             _resp("Entries", {"type": "object", "properties": {
                 "entries": {"type": "array", "items": entry},
                 "next_before": {"type": ["integer", "null"]},
                 "accounts": {"type": "array", "items": {"type": "string"}}}}),
             params=[tz,
                     q("account", "This account and everything below it (a manager: one "
                                  "they manage or below)"),
                     q("since", f"From this time: {when}"),
                     q("until", f"Before this time: {when}; a bare date includes that day"),
                     q("what", "Comma-separated: grants, nodes, cancellations, preemptions, "
                               "requeues"),
                     q("format", "json (default) or csv (a download of up to 10,000 entries; "
                                 "every cell that would start a spreadsheet formula is "
                                 "prefixed with ')"),
                     q("before", "Only entries with a smaller id (paging)", {"type": "integer"}),
                     q("limit", "At most this many (1..1000; JSON)", {"type": "integer"})],
             extra={"400": "Bad filter (the field is named)"})
    op["responses"]["200"]["content"]["text/csv"] = {"schema": {"type": "string"}}
    return op


def mine_paths() -> dict:
    """A researcher's own figures for the sidebar (handlers/mine.py)."""
    num = {"type": "number", "nullable": True}
    figs = {"charged_gpu_h": NUM, "busy_gpu_h": num, "measured_gpu_h": NUM,
            "idle_gpu_h": num, "idle_share": num}
    tz = {"name": "tz", "in": "query", "required": False, "schema": {"type": "string"},
          "description": "IANA time zone of the week (default UTC)"}
    return {
        "/me/week": {"get": _op(
            "My GPU-hours this week (Monday 00:00 in tz until now): charged, busy (null: "
            "unknown), measured and idle, per project I am a member of (my own line) and in "
            "total", _resp("My week", {"type": "object", "properties": {
                "from": NUM, "to": NUM, "tz": {"type": "string"},
                "totals": {"type": "object", "properties": figs},
                "projects": {"type": "array", "items": {"type": "object", "properties": {
                    "project": {"type": "string"}, **figs}}}}}),
            params=[tz], extra={"400": "Bad tz"})},
        "/sessions/{id}/utilisation": {"get": _op(
            "My session's live GPU utilisation: the busy fraction of its latest sample, "
            "when and by what (status live, stale or unknown: nothing measures it)",
            _resp("Utilisation", {"type": "object", "properties": {
                "status": {"type": "string", "enum": ["live", "stale", "unknown"]},
                "utilisation": num, "at": num, "age_s": num, "average": num,
                "source": {"type": "string", "nullable": True},
                "memory": {"type": "array", "nullable": True, "description": (
                    "memory its GPUs use per slice (null: unknown)"), "items": {
                    "type": "object", "properties": {
                        "gpu": {"type": "string"}, "used_bytes": {"type": "integer"},
                        "total_bytes": {"type": "integer"}, "shared": {"type": "boolean"}}}},
                "memory_at": num}}),
            params=[{"name": "id", "in": "path", "required": True, "schema": WORKLOAD_ID}],
            extra={"404": "No such session"})},
        **budget_request_paths(),
    }


def budget_request_paths() -> dict:
    """Asking for more budget (handlers/budget_requests.py)."""
    req = {"type": "object", "properties": {
        "id": {"type": "integer"}, "project": {"type": "string"}, "user": {"type": "string"},
        "gpu_hours": NUM, "reason": {"type": "string"},
        "state": {"type": "string", "enum": ["pending", "granted", "declined"]},
        "created_at": NUM, "decided_at": NULL_NUM,
        "decided_by": {"type": "string", "nullable": True}, "note": {"type": "string"},
        "grant_version": {"type": "integer", "nullable": True}}}
    rid = [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}]
    answered = {"404": "No such request", "409": "Answered already, or the project is "
                "funded by a share"}
    return {
        "/budget-requests": {
            "get": _op("Requests for more GPU-hours: an admin's all, a manager's those they "
                       "may grant, and one's own", _resp("Requests", {
                           "type": "object", "properties": {
                               "requests": {"type": "array", "items": req}}}),
                       params=[{"name": "state", "in": "query", "required": False,
                                "schema": {"type": "string"},
                                "description": "pending (default), granted, declined; "
                                               "comma-separated"}],
                       extra={"400": "Bad state"}),
            "post": _op("Ask for more GPU-hours per window for a project one is a member of "
                        "(scope submit); its managers are told", _resp("The request", req),
                        ok_code="201", body={
                            "type": "object", "required": ["project", "gpu_hours", "reason"],
                            "additionalProperties": False, "properties": {
                                "project": {"type": "string"},
                                "gpu_hours": {"type": "number", "minimum": 0,
                                              "exclusiveMinimum": True},
                                "reason": {"type": "string", "maxLength": 2000}}},
                        extra={"409": "A request of yours for it is pending"})},
        "/budget-requests/{id}/grant": {"post": _op(
            "Grant it (scope manage): the project's grant is raised by the amount through the "
            "grant change; the member is told", _resp("The request and the new grant"),
            params=rid, body={"type": "object", "additionalProperties": False,
                              "properties": {"note": {"type": "string"}}}, extra=answered)},
        "/budget-requests/{id}/decline": {"post": _op(
            "Decline it with a reason (scope manage); the member is told",
            _resp("The request"), params=rid,
            body={"type": "object", "required": ["reason"], "additionalProperties": False,
                  "properties": {"reason": {"type": "string", "minLength": 1}}},
            extra=answered)},
    }


def reservation_paths() -> dict[str, Any]:
    """The reservations' part of the service's OpenAPI document."""
    num = {"type": "number"}
    booking = {"type": "object", "properties": {
        "id": {"type": "string"}, "project": {"type": "string"},
        "cluster": {"type": "string", "nullable": True}, "gpus": {"type": "integer"},
        "devices": {"type": "array", "items": {"type": "string"}},
        "nodes": {"type": "array", "items": {"type": "string"}}, "start": num, "end": num,
        "state": {"type": "string", "enum": ["booked", "active", "ended", "cancelled"]},
        "note": {"type": "string"}, "created_by": {"type": "string"}, "created_at": num}}
    time = {"oneOf": [num, {"type": "string", "format": "date-time"}]}
    body = {"type": "object", "required": ["project", "gpus", "start", "end"],
            "additionalProperties": False, "properties": {
                "project": {"type": "string"}, "gpus": {"type": "integer", "minimum": 1},
                "start": time, "end": time, "nodes": {"type": "array", "items": {
                    "type": "string"}}, "gpu_model": {"type": "string"},
                "cluster": {"type": "string"}, "note": {"type": "string"}}}
    rid = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
    bad = {"400": "Cannot be booked: the window in the past or ending before it starts, over "
                  "capacity, a node's other booking, an unknown project, a bad type (the "
                  "field is named; nothing is booked)"}
    return {
        "/reservations": {
            "get": _op("Advance reservations not yet over (?all=1: every one, cancelled too) "
                       "of the projects I see", _resp("Reservations", {"type": "object",
                       "properties": {"reservations": {"type": "array", "items": booking}}})),
            "post": _op("Book whole GPUs for a project over a window (admins; managers for "
                        "their projects)", _resp("Booked", booking), body=body, ok_code="201",
                        extra=bad)},
        "/reservations/{id}": {
            "get": _op("One reservation", _resp("Reservation", booking), params=rid,
                       extra={"404": "No such reservation"}),
            "delete": _op("Cancel a reservation (admins; managers for their projects)",
                          _resp("Cancelled", booking), params=rid,
                          extra={"404": "No such reservation"})},
    }
