"""Notices delivered outside JupyterLab: a webhook and e-mail, as each user chooses.

A researcher sets a preference (``PUT /api/v1/notices/settings``): a webhook URL that gets
each notice as a JSON POST, an e-mail address that gets it through the site's SMTP relay, or
both. The leader runs :func:`notice_delivery`: every ``interval`` seconds it reads the
notices recorded since the last round (decisions of :data:`notices.NOTICE_KINDS`, after the
ledger's ``notices.delivered`` mark), puts them in words (``service/notices.py``) and sends
them. A webhook is tried ``webhook_tries`` times with exponential backoff; a relay that
refuses is tried as often. What still fails is recorded as a ``notice-failed`` decision (the
channel and the error, for the admins' audit log and the user's settings page); nothing else
depends on it: scheduling goes on and the notice stays stored and shown in JupyterLab.

Configured as ``c.NoticeDelivery.<option>`` in the service's config file.
"""

from __future__ import annotations

import asyncio
import json
import re
import smtplib
import ssl
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sqlalchemy import select
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Bool, Float, Integer, List, Unicode
from traitlets.config import LoggingConfigurable

from jupyter_gpubudget.ledger.models import DecisionRow, NodeHealthRow, NoticePrefRow, WorkloadRow

from .base import ApiError
from .notices import NOTICE_KINDS, Notice, build_notice

if TYPE_CHECKING:
    from jupyter_gpubudget.ledger import Ledger

    from .app import GpuBudgetService

#: the ledger's service-state key holding the id of the last decision delivered
MARK = "notices.delivered"
_EMAIL = re.compile(r"^[^@\s<>\"',;]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}$")
_DRAIN = re.compile(r"^node (\S+) is draining")


# ------------------------------------------------------------------ preferences
def pref_json(row: NoticePrefRow | None, user: str) -> dict[str, Any]:
    return {"user": user, "webhook": row.webhook if row else None,
            "email": row.email if row else None,
            "changed_at": row.changed_at if row else None}


def check_pref(body: Any) -> dict[str, str | None]:
    """``webhook`` (an http(s) URL) and ``email`` of a preference body, checked; a bad
    field raises a 400 naming it (nothing is changed)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object with webhook and/or email")
    unknown = sorted(set(body) - {"webhook", "email"})
    if unknown:
        raise ApiError(400, f"{unknown[0]}: unknown field (webhook, email)", unknown[0])
    out: dict[str, str | None] = {}
    for k in ("webhook", "email"):
        v = body.get(k)
        if v is None or v == "":
            out[k] = None
            continue
        if not isinstance(v, str) or len(v) > 2000:
            raise ApiError(400, f"{k}: a string (at most 2000 characters) or null", k)
        out[k] = v.strip()
    hook = out["webhook"]
    if hook is not None:
        try:
            u = urlsplit(hook)
            ok = u.scheme in ("http", "https") and bool(u.hostname) and u.port != 0
        except ValueError:  # a bad port or IPv6 literal
            ok = False
        if not ok or any(c.isspace() for c in hook):
            raise ApiError(400, f"webhook: {hook!r} is not an http(s) URL", "webhook")
    mail = out["email"]
    if mail is not None and not _EMAIL.fullmatch(mail):
        raise ApiError(400, f"email: {mail!r} is not an e-mail address", "email")
    return out


def get_pref(ledger: Ledger, user: str) -> NoticePrefRow | None:
    with ledger.ro() as s:
        return s.get(NoticePrefRow, user)


def set_pref(ledger: Ledger, user: str, webhook: str | None, email: str | None,
             now: float) -> NoticePrefRow | None:
    """Store (or, with neither channel, remove) a user's preference; the row or None."""
    with ledger.tx() as s:
        row = s.get(NoticePrefRow, user)
        if webhook is None and email is None:
            if row is not None:
                s.delete(row)
            return None
        if row is None:
            row = NoticePrefRow(user=user, webhook=webhook, email=email, changed_at=now)
            s.add(row)
        else:
            row.webhook, row.email, row.changed_at = webhook, email, now
        s.flush()
        s.expunge(row)
        return row


def failures_of(ledger: Ledger, user: str, limit: int = 10) -> list[dict[str, Any]]:
    """The user's latest failed deliveries, newest first."""
    with ledger.ro() as s:
        q = (select(DecisionRow).where(DecisionRow.kind == "notice-failed",
                                       DecisionRow.actor == f"delivery:{user}")
             .order_by(DecisionRow.id.desc()).limit(limit))
        return [{"at": d.at, "channel": (d.detail or {}).get("channel"),
                 "error": d.reason, "tries": (d.detail or {}).get("tries"),
                 "workload": d.workload} for d in s.scalars(q)]


# ------------------------------------------------------------------ notices in words
def _cause_of(s: Any, d: DecisionRow) -> tuple[str, float | None]:
    """The reason the core gave for the preemption behind ``d`` (a requeue or a preempt
    without one), and its loss in GPU-hours."""
    q = (select(DecisionRow).where(DecisionRow.workload == d.workload,
                                   DecisionRow.kind.in_(("preempt-requested", "preempting")),
                                   DecisionRow.id < d.id)
         .order_by(DecisionRow.id.desc()).limit(1))
    prev = s.scalars(q).first()
    if prev is None:
        return "", None
    lost = (prev.detail or {}).get("lost_gpu_hours")
    return prev.reason, (float(lost) if isinstance(lost, (int, float)) else None)


def notice_of(ledger: Ledger, d: DecisionRow, w: WorkloadRow, s: Any = None) -> Notice:
    """The notice for decision ``d`` of workload ``w``, with what the ledger knows around it:
    the core's reason for a preemption, the admin's note on a draining node."""
    with ledger.ro(s) as s:
        cause, lost = d.reason, None
        if d.kind == "requeue" or (d.kind == "preempt" and d.reason == "preempted"):
            c, lost = _cause_of(s, d)
            cause = c or ("" if d.kind == "requeue" else d.reason)
        note = node = None
        m = _DRAIN.match(cause or "")
        if m:
            node = m.group(1)
            h = s.get(NodeHealthRow, node)
            note = h.reason if h is not None else None
        return build_notice(
            kind=d.kind, reason=d.reason, detail=d.detail, actor=d.actor,
            workload={"id": w.id, "name": w.name, "user": w.user, "project": w.project,
                      "kind": w.kind, "resumable": w.resumable, "state": w.state},
            cause_reason=cause, drain_note=note, drain_node=node, lost_gpu_hours=lost,
            at=d.at)


def is_notice(d: DecisionRow, w: WorkloadRow) -> bool:
    """Whether the user is told about ``d``: not their own cancel, not a restore that
    worked."""
    if d.kind == "restore":
        return bool((d.detail or {}).get("error")) and not any(
            k.get("restored") for k in (d.detail or {}).get("kernels") or []
            if isinstance(k, dict))
    return d.kind in NOTICE_KINDS and not (d.kind == "cancel" and d.actor == w.user)


def pending_notices(ledger: Ledger, after: int, limit: int = 200
                    ) -> list[tuple[int, str, Notice, NoticePrefRow]]:
    """Notices recorded after decision ``after`` for users with a preference:
    ``(decision id, user, notice, preference)``, oldest first."""
    with ledger.ro() as s:
        q = (select(DecisionRow, WorkloadRow, NoticePrefRow)
             .join(WorkloadRow, DecisionRow.workload == WorkloadRow.id)
             .join(NoticePrefRow, NoticePrefRow.user == WorkloadRow.user)
             .where(DecisionRow.id > after, DecisionRow.kind.in_(NOTICE_KINDS))
             .order_by(DecisionRow.id).limit(limit))
        out = []
        rows = s.execute(q).all()
        for d, w, p in rows:
            if is_notice(d, w):
                s.expunge(p)
                out.append((d.id, w.user, notice_of(ledger, d, w, s), p))
        # requests for more budget and their answers (no workload): up to where this round
        # reads the others
        from .handlers.budget_requests import pending_deliveries

        top = rows[-1][0].id if len(rows) >= limit else None
        for did, user, n in pending_deliveries(ledger, after, s):
            pref = s.get(NoticePrefRow, user)
            if pref is not None and (top is None or did <= top):
                s.expunge(pref)
                out.append((did, user, n, pref))
        return sorted(out, key=lambda x: x[0])


def last_decision_id(ledger: Ledger) -> int:
    with ledger.ro() as s:
        return int(s.scalar(select(DecisionRow.id).order_by(DecisionRow.id.desc()).limit(1))
                   or 0)


# ------------------------------------------------------------------ sending
class DeliveryFailed(Exception):
    def __init__(self, channel: str, error: str, tries: int) -> None:
        super().__init__(f"{channel}: {error} (after {tries} tries)")
        self.channel, self.error, self.tries = channel, error, tries


class NoticeDelivery(LoggingConfigurable):
    """Sends notices to webhooks and through an SMTP relay (see the module docstring)."""

    interval = Float(15.0, help="Seconds between two rounds of delivery (a round sends every "
                                "notice recorded since the last).").tag(config=True)
    webhook_timeout = Float(10.0, help="Seconds one webhook POST may take (connect and "
                                       "answer).").tag(config=True)
    webhook_tries = Integer(4, help="Tries per notice and channel before the failure is "
                                    "recorded (webhook and e-mail).").tag(config=True)
    backoff = Float(1.0, help="Seconds before the second try; doubled before each next "
                              "one.").tag(config=True)
    smtp_host = Unicode("", help="The SMTP relay's host name; empty: no e-mail is sent (an "
                                 "e-mail preference is refused).").tag(config=True)
    smtp_port = Integer(25, help="The SMTP relay's port (25, or 587 with STARTTLS, 465 with "
                                 "smtp_ssl).").tag(config=True)
    smtp_starttls = Bool(False, help="Upgrade the relay connection with STARTTLS before "
                                     "sending.").tag(config=True)
    smtp_ssl = Bool(False, help="Connect to the relay over TLS from the start (port 465)."
                    ).tag(config=True)
    smtp_user = Unicode("", help="User name for the relay's AUTH (empty: no AUTH)."
                        ).tag(config=True)
    smtp_password = Unicode("", help="Password for the relay's AUTH; prefer a config file "
                                     "readable only by the service's user.").tag(config=True)
    smtp_from = Unicode("gpubudget@localhost", help="The From address of notice e-mails."
                        ).tag(config=True)
    smtp_timeout = Float(20.0, help="Seconds one SMTP conversation may take.").tag(config=True)
    webhook_hosts = List(Unicode(), help="Host names a webhook may point at: a name, or "
                                         "'.example.org' for it and every name below it; "
                                         "empty (default): any host. The service POSTs from "
                                         "inside your network: list your chat / alerting "
                                         "hosts to keep webhooks off internal services."
                         ).tag(config=True)

    def check_webhook_host(self, url: str) -> None:
        """A 400 naming ``webhook`` when ``url``'s host is not in :attr:`webhook_hosts`."""
        if not self.webhook_hosts:
            return
        host = (urlsplit(url).hostname or "").lower().rstrip(".")
        for h in self.webhook_hosts:
            h = h.lower()
            if host == h.lstrip(".") or (h.startswith(".") and host.endswith(h)):
                return
        raise ApiError(400, f"webhook: host {host!r} is not one this site sends notices to "
                            f"({', '.join(self.webhook_hosts)})", "webhook")

    async def _retry(self, channel: str, send: Any) -> int:
        """Run ``send()`` up to ``webhook_tries`` times with doubling backoff; the tries it
        took, or :class:`DeliveryFailed` with the last error."""
        tries = max(1, self.webhook_tries)
        delay = self.backoff
        err = ""
        for i in range(1, tries + 1):
            try:
                await send()
                return i
            except Exception as e:  # noqa: BLE001 - every failure is retried and recorded
                err = _describe(e)
                self.log.info("notice %s try %d/%d failed: %s", channel, i, tries, err)
            if i < tries:
                await asyncio.sleep(delay)
                delay *= 2
        raise DeliveryFailed(channel, err, tries)

    async def post_webhook(self, url: str, user: str, notice: Notice) -> int:
        """POST the notice as JSON to ``url`` (retried); the tries it took."""
        body = json.dumps({"user": user, **notice.as_json()}).encode()
        client = AsyncHTTPClient()

        async def send() -> None:
            await client.fetch(HTTPRequest(
                url, method="POST", body=body, follow_redirects=False,
                headers={"Content-Type": "application/json",
                         "User-Agent": "jupyter-gpubudget-notices"},
                connect_timeout=self.webhook_timeout, request_timeout=self.webhook_timeout))

        return await self._retry("webhook", send)

    def message(self, to: str, notice: Notice) -> EmailMessage:
        m = EmailMessage()
        m["From"] = self.smtp_from
        m["To"] = to
        m["Subject"] = notice.title
        m["X-GpuBudget-Notice"] = notice.kind
        m.set_content(notice.as_text())
        return m

    def _smtp_send(self, msg: EmailMessage) -> None:
        cls = smtplib.SMTP_SSL if self.smtp_ssl else smtplib.SMTP
        with cls(self.smtp_host, self.smtp_port, timeout=self.smtp_timeout) as smtp:
            if self.smtp_starttls and not self.smtp_ssl:
                smtp.starttls(context=ssl.create_default_context())
            if self.smtp_user:
                smtp.login(self.smtp_user, self.smtp_password)
            smtp.send_message(msg)

    async def send_email(self, to: str, notice: Notice) -> int:
        """Send the notice to ``to`` through the relay, in a thread (retried)."""
        if not self.smtp_host:
            raise DeliveryFailed("email", "no SMTP relay configured (smtp_host)", 0)
        msg = self.message(to, notice)
        return await self._retry("email", lambda: asyncio.to_thread(self._smtp_send, msg))

    async def deliver(self, user: str, notice: Notice, webhook: str | None,
                      email: str | None) -> list[DeliveryFailed]:
        """Send one notice on the user's channels, both at once; the failures."""
        jobs = []
        if webhook:
            jobs.append(self.post_webhook(webhook, user, notice))
        if email:
            jobs.append(self.send_email(email, notice))
        done = await asyncio.gather(*jobs, return_exceptions=True)
        out = []
        for r in done:
            if isinstance(r, DeliveryFailed):
                out.append(r)
            elif isinstance(r, BaseException):
                out.append(DeliveryFailed("webhook", _describe(r), 1))
        return out

    async def round(self, ledger: Ledger, now: float, in_thread: Any = None) -> int:
        """One round: deliver every notice recorded since the mark, record what failed,
        move the mark. The first round ever starts from now (no history is mailed).
        Returns how many notices were sent (on at least one channel)."""
        run = in_thread or (lambda f, *a: asyncio.to_thread(f, *a))
        raw = await run(ledger.get_state, MARK)
        if raw is None:
            await run(ledger.set_state, MARK, str(await run(last_decision_id, ledger)))
            return 0
        after = int(raw)
        sent = 0
        for did, user, notice, pref in await run(pending_notices, ledger, after):
            fails = await self.deliver(user, notice, pref.webhook, pref.email)
            channels = int(bool(pref.webhook)) + int(bool(pref.email))
            sent += len(fails) < channels
            for f in fails:
                self.log.warning("notice %d for %s not delivered by %s: %s", did, user,
                                 f.channel, f.error)
                await run(_record_failure, ledger, now, did, user, notice, f)
            await run(ledger.set_state, MARK, str(did))
        return sent


def _record_failure(ledger: Ledger, now: float, did: int, user: str, notice: Notice,
                    f: DeliveryFailed) -> None:
    ledger.record_decision(now=now, kind="notice-failed", workload=notice.details.get("workload"),
                           actor=f"delivery:{user}", reason=f.error,
                           detail={"channel": f.channel, "tries": f.tries, "decision": did,
                                   "notice": notice.kind})


def _describe(e: BaseException) -> str:
    if isinstance(e, HTTPClientError):
        return f"HTTP {e.code}" + (f" {e.message}" if e.message else "")
    if isinstance(e, DeliveryFailed):
        return e.error
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


async def notice_delivery(svc: GpuBudgetService) -> None:
    """The leader's delivery task: a round every ``interval`` seconds; a failing round is
    logged and tried again (nothing else waits on it)."""
    d = NoticeDelivery(parent=svc)
    while True:
        await asyncio.sleep(d.interval)
        try:
            await d.round(svc.ledger, svc.clock())
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the next round tries again
            d.log.exception("notice delivery round failed")
