"""`gpubudget submit | jobs | cancel | logs`: the batch-job client.

``register(subparsers)`` adds the sub-commands; each sets ``func`` to a ``cmd_*(args) -> int``.

The client finds the service at ``--url`` / ``$GPUBUDGET_URL`` (default
``$JUPYTERHUB_URL/services/gpubudget``, else ``http://127.0.0.1:8000/services/gpubudget``) and
authenticates with ``--token`` / ``$GPUBUDGET_TOKEN`` / ``$JUPYTERHUB_API_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote


def _default_url() -> str:
    if os.environ.get("GPUBUDGET_URL"):
        return os.environ["GPUBUDGET_URL"]
    hub = os.environ.get("JUPYTERHUB_URL", "http://127.0.0.1:8000")
    return hub.rstrip("/") + "/services/gpubudget"


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="service URL (default: $GPUBUDGET_URL or "
                   "$JUPYTERHUB_URL/services/gpubudget)")
    p.add_argument("--token", default=None, help="JupyterHub API token (default: "
                   "$GPUBUDGET_TOKEN or $JUPYTERHUB_API_TOKEN)")
    p.add_argument("--json", action="store_true", help="print the raw JSON answer")


class ServiceError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        msg = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{status}: {msg}")
        self.status, self.body = status, body


def call(args: argparse.Namespace, method: str, path: str, body: Any = None,
         headers: dict | None = None) -> Any:
    url = (args.url or _default_url()).rstrip("/") + "/api/v1" + path
    token = args.token or os.environ.get("GPUBUDGET_TOKEN") or os.environ.get(
        "JUPYTERHUB_API_TOKEN")
    req = urllib.request.Request(url, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"token {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            raise ServiceError(e.code, json.loads(raw)) from None
        except ValueError:
            raise ServiceError(e.code, raw.decode(errors="replace")) from None


def load_job_file(path: str) -> dict:
    """Read a job YAML and check it locally; errors name the file, line and field."""
    from jupyter_gpubudget.core.yamlnodes import ConfigError, parse
    from jupyter_gpubudget.service.validate import Invalid, parse_job

    text = Path(path).read_text()
    root = parse(text, path)
    fields = root.mapping()

    def plain(node: Any) -> Any:
        v = node.value
        if isinstance(v, dict):
            return {k: plain(n) for k, n in v.items()}
        if isinstance(v, list):
            return [plain(n) for n in v]
        return v

    body = {k: plain(n) for k, n in fields.items()}
    try:
        parse_job(body)
    except Invalid as e:
        node = fields.get(e.field, root)
        raise ConfigError(e.message, e.field, node.line, path) from None
    return body


def _row(w: dict) -> str:
    if w.get("array"):  # a job array: one row, its tasks counted per state
        counts = " ".join(f"{n} {st}" for st, n in sorted(w["counts"].items()))
        cap = f" (max {w['max_running']} running)" if w.get("max_running") else ""
        return (f"{w['id']:<17} {'array':<10} {w['project']:<14} {'-':<14} "
                f"{w['name']:<16} {counts}{cap}")
    where = ",".join(f"{s['node']}:{s['gpu']}" for s in (w.get("placement") or [])) or "-"
    extra = ""
    if w["state"] == "pending" and w.get("waiting_for"):
        extra = w["waiting_for"]  # waits for other jobs, not for GPUs
    elif w["state"] == "pending" and w.get("queue_position"):
        extra = f"queue #{w['queue_position']}"
    elif w["state"] == "running" and w.get("protected_left_s") is not None:
        extra = f"protected {w['protected_left_s'] / 60:.0f} min"
    elif w.get("exit_code") is not None:
        extra = f"exit {w['exit_code']}"
    fc = w.get("preemption_forecast") or {}
    if w["state"] == "running" and fc.get("likely"):  # the core's outlook
        extra = "; ".join(x for x in (extra, f"may be preempted at {fc.get('at_text')}: "
                                             f"{fc.get('reason')}") if x)
    return f"{w['id']:<17} {w['state']:<10} {w['project']:<14} {where:<14} {w['name']:<16} {extra}"


def cmd_submit(args: argparse.Namespace) -> int:
    from jupyter_gpubudget.core.yamlnodes import ConfigError

    try:
        body = load_job_file(args.job)
    except (OSError, ConfigError) as e:
        print(f"gpubudget submit: {e}", file=sys.stderr)
        return 2
    if args.project:
        body["project"] = args.project
    if args.dry_run:
        return _dry_run(args, body)
    try:
        out = call(args, "POST", "/jobs", body,
                   headers={"Idempotency-Key": args.key or uuid.uuid4().hex})
    except (ServiceError, OSError) as e:
        print(f"gpubudget submit: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
    elif out.get("array"):
        print(f"submitted {out['id']} (array of {len(out['tasks'])} tasks; cancel one with "
              f"gpubudget cancel {out['id']}_<index>)")
    else:
        print(f"submitted {out['id']} ({out['state']})")
    return 0


def _dry_run(args: argparse.Namespace, body: dict) -> int:
    """``submit --dry-run``: what the job would get, from the service's quote (the spawn
    form's): its predicted start, what its time limit costs, and with off-peak prices the
    price now and the cheaper start. Nothing is submitted."""
    from urllib.parse import urlencode

    from jupyter_gpubudget.service.validate import parse_job

    job = parse_job(body)
    run = job["time_limit"] or job["min_runtime"] or 3600.0
    params = {"project": job["project"], "min_runtime": f"{run:g}s"}
    if isinstance(body.get("slice"), str):
        params["slice"] = body["slice"] if body["slice"].startswith("mps:") \
            else "mig:" + body["slice"]
    else:
        params["gpus"] = str(body.get("gpus", 0))
    if job["request"].cluster:
        params["cluster"] = job["request"].cluster
    try:
        out = call(args, "GET", "/sessions/quote?" + urlencode(params))
    except (ServiceError, OSError) as e:
        print(f"gpubudget submit: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    q = out["quote"]
    if q.get("starts_now"):
        when = "starts now"
    elif q.get("predicted_start") is not None:
        when = f"predicted start in {max(0.0, q['predicted_start'] - out['now']) / 60:.0f} min"
    else:
        when = "no predicted start yet"
    print(f"dry run: nothing submitted. {job['project']}: {when}"
          + ("" if q.get("backed") else " (unbacked)"))
    hours = f"{run / 3600:g} h"
    price = q.get("price")
    if price is None:
        print(f"its {hours} cost {q['fraction'] * run / 3600:.2f} GPU-h")
        return 0
    print(price["text"])
    line = f"its {hours} cost {price['run_gpu_hours']:.2f} GPU-h"
    if price.get("run_off_peak_gpu_hours") is not None:
        line += (f" now, {price['run_off_peak_gpu_hours']:.2f} GPU-h from "
                 f"{price['next_off_peak_local'][11:16]} (start: off-peak waits for it)")
    print(line)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    try:
        path = "/jobs" + (f"?state={args.state}" if args.state else "")
        out = call(args, "GET", path)
    except (ServiceError, OSError) as e:
        print(f"gpubudget jobs: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{'ID':<17} {'STATE':<10} {'PROJECT':<14} {'WHERE':<14} {'NAME':<16}")
        for w in out["jobs"]:
            print(_row(w))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    rc = 0
    for wid in args.ids:
        try:
            out = call(args, "DELETE", f"/jobs/{quote(wid, safe='')}")
            print(json.dumps(out, indent=2) if args.json else f"cancelled {wid}")
        except (ServiceError, OSError) as e:
            print(f"gpubudget cancel {wid}: {e}", file=sys.stderr)
            rc = 1
    return rc


ENDED = ("done", "failed", "cancelled", "preempted")


def cmd_logs(args: argparse.Namespace) -> int:
    """Print a job's output from the start; with --follow keep printing what it writes (and
    what a requeued attempt writes) until it ends."""
    out, err = sys.stdout, sys.stderr
    path = f"/jobs/{quote(args.id, safe='')}/log"
    offset, attempt, last_look = 0, None, False
    try:
        while True:
            q = f"?offset={offset}&limit=1048576" + (f"&attempt={attempt}" if attempt else "")
            page = call(args, "GET", path + q)
            attempt = attempt or page["attempt"] or None
            out.write(page["text"])
            out.flush()
            offset = page["next_offset"]
            if offset < page["size"]:
                continue  # more is there already
            if not args.follow:
                if page["attempt"] == 0:
                    print(f"(job {args.id} is {page['state']}: no output yet)", file=err)
                return 0
            if last_look:
                print(f"(job {args.id} {page['state']})", file=err)
                return 0
            latest = call(args, "GET", path + "?limit=1")  # the newest attempt and the state
            if latest["attempt"] and latest["attempt"] != attempt:
                if attempt is not None:  # requeued after a preemption: a new attempt
                    print(f"--- attempt {latest['attempt']} ---", file=err)
                attempt, offset = latest["attempt"], 0
                continue
            if latest["state"] in ENDED:
                last_look = True  # read what it wrote before it ended, then stop
                continue
            time.sleep(args.interval)
    except (ServiceError, OSError) as e:
        print(f"gpubudget logs {args.id}: {e}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130


def add_logs_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("logs", help="print a batch job's output (stdout and stderr)")
    p.add_argument("id", help="job id")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the job ends")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between polls with --follow (default 1)")
    _client_args(p)
    p.set_defaults(func=cmd_logs)
    return p


def add_submit_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("submit", help="submit a batch job (job YAML: command, project, gpus "
                       "or slice, min_runtime, resumable, time_limit, name, env; array and "
                       "max_running for a job array; after and after_kind to run after "
                       "other jobs)")
    p.add_argument("job", help="job YAML file")
    p.add_argument("--project", help="charge this project (overrides the file)")
    p.add_argument("--key", help="idempotency key (default: random; reuse it to retry safely)")
    p.add_argument("--dry-run", action="store_true",
                   help="submit nothing: show the predicted start, what the job's time limit "
                        "costs and, with off-peak prices, the price now and the cheaper start")
    _client_args(p)
    p.set_defaults(func=cmd_submit)
    return p


def add_jobs_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("jobs", help="list my batch jobs")
    p.add_argument("--state", help="comma-separated states (pending,running,done,...)")
    _client_args(p)
    p.set_defaults(func=cmd_jobs)
    return p


def add_cancel_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("cancel", help="cancel batch jobs")
    p.add_argument("ids", nargs="+", help="job ids; an array's id cancels all its tasks, "
                   "<array>_<index> one task")
    _client_args(p)
    p.set_defaults(func=cmd_cancel)
    return p


def register(sub: Any) -> None:
    for add in (add_submit_parser, add_jobs_parser, add_cancel_parser, add_logs_parser):
        add(sub)
