"""The OpenAPI 3.0 document the service serves at /api/v1/openapi.json."""

from __future__ import annotations

from typing import Any

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
    "state": {"type": "string",
              "enum": ["pending", "running", "done", "failed", "cancelled", "preempted"]},
    "request": {"type": "object"},
    "placement": {"type": "array", "nullable": True, "items": {"type": "object"}},
    "submitted_at": NUM, "started_at": NULL_NUM, "ended_at": NULL_NUM,
    "backed": {"type": "boolean"}, "protected_until": NULL_NUM,
    "protected_left_s": {**NULL_NUM, "description": "Protected time left (running, backed)"},
    "queue_position": {"type": "integer", "nullable": True},
    "predicted_start": {**NULL_NUM, "description": "Reserved start time, when reserved"},
    "min_runtime": NUM, "resumable": {"type": "boolean"}, "time_limit": NULL_NUM,
    "preemptions": {"type": "integer"}, "exit_code": {"type": "integer", "nullable": True},
    "reason": {"type": "string"}, "backend": {"type": "string"}}}

DURATION = {"oneOf": [{"type": "number", "minimum": 0},
                      {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*[smhd]?\s*$"}]}

JOB = {"type": "object", "required": ["command", "project"], "additionalProperties": False,
       "properties": {
           "command": {"oneOf": [{"type": "string", "minLength": 1},
                                 {"type": "array", "minItems": 1, "items": {"type": "string"}}]},
           "project": NAME,
           "gpus": {"type": "integer", "minimum": 0, "maximum": 1024},
           "slice": {"type": "string", "description": "MIG profile ('1g.18gb') or 'mps:<milli>[:<MiB>]'"},
           "min_runtime": DURATION, "time_limit": DURATION,
           "resumable": {"type": "boolean"},
           "name": {"type": "string", "maxLength": 200},
           "kind": {"type": "string", "enum": ["batch", "debug"]},
           "gpu_model": {"type": "string"}, "single_node": {"type": "boolean"},
           "env": {"type": "object", "additionalProperties": {"type": "string"}}}}

GRANT_BODY = {"type": "object", "additionalProperties": False, "properties": {
    "grant_hours": {"type": "number", "minimum": 0, "maximum": 1e9},
    "share_pct": {"type": "number", "minimum": 0, "maximum": 100},
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
        "/openapi.json": {"get": _op("This document", _resp("OpenAPI 3.0"), auth=False)},
        "/accounts": {"get": _op("Accounts the caller may see", _resp("Accounts"))},
        "/accounts/{name}": {"get": _op("One account", _resp("Account"), params=acct, extra=nf)},
        "/accounts/{name}/grants": {"get": _op("Grant versions (who, when)", _resp("History"),
                                               params=acct, extra=nf)},
        "/accounts/{name}/grant": {"put": _op(
            "Change a grant (admins, the account's managers)", _resp("New grant version"),
            params=acct, body=GRANT_BODY, extra=nf)},
        "/accounts/{name}/usage": {"get": _op("Usage and standing", _resp("Usage"),
                                              params=acct, extra=nf)},
        "/workloads/me": {"get": _op("My workloads", _resp("Workloads", {
            "type": "object", "properties": {"user": {"type": "string"}, "workloads": {
                "type": "array", "items": WORKLOAD}}}), params=[STATE_Q],
            extra={"400": "Unknown state"})},
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
        "/notices": {"get": _op("Preemption notices for my workloads", _resp("Notices"))},
        "/usage/events": {"post": _op(
            "Usage reported by an external backend (admins)", _resp("Applied"), body=EVENT,
            params=[IDEM], extra={"404": "No such workload", "409": "Wrong state"})},
    }
    paths.update(session_paths())
    paths.update(snapshot_paths())
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
        "inventory": {"type": "string", "enum": ["declared", "nvml"]},
        "preempt_deadline": {"type": "number", "nullable": True, "description":
                             "When the server is stopped at the latest after a preemption "
                             "(preempt-requested time + policy.stop_grace)"},
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
                           "gpu_model": {"type": "string"}, "min_runtime": DURATION,
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
        "/sessions/{id}/heartbeat": {"post": _op("The server is alive: checkpoint the charge",
                                                 _resp("Session", session), params=sid,
                                                 extra=nf)},
        "/sessions/{id}/idle": {"post": _op(
            "Report the session idle: notice, protection ends", _resp("Session", session),
            params=sid, body={"type": "object", "properties": {
                "idle_s": {"type": "number", "minimum": 0}, "source": {"type": "string"}}},
            extra={**nf, "409": "Not running"})},
    }
