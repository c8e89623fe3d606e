"""Notices delivered outside JupyterLab (service/delivery.py): a webhook POST against a real
tornado server on a free port, e-mail through a real SMTP server (aiosmtpd), retries with
backoff, failures recorded; and in the real service (with JupyterHub): a preference set over
REST, an unreachable webhook that changes nothing else — the notice is still stored and
shown, the e-mail still goes out, the next job still starts."""

from __future__ import annotations

import json
import time
from email import message_from_bytes
from email.policy import default as email_policy

import pytest
from aiosmtpd.controller import Controller
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger import nodes as N
from jupyter_gpubudget.service.base import ApiError
from jupyter_gpubudget.service.delivery import (
    MARK,
    DeliveryFailed,
    NoticeDelivery,
    check_pref,
    failures_of,
    set_pref,
)
from jupyter_gpubudget.service.notices import build_notice
from tests.fixtures.hub import ServiceProc, http
from tests.fixtures.ports import free_port

from .conftest import cleanup

JOB = {"id": "0f3a9c", "name": "train", "user": "bob", "project": "lattice",
       "kind": "batch", "resumable": False, "state": "cancelled"}


class Inbox:
    """aiosmtpd handler keeping every message it is given."""

    def __init__(self) -> None:
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope):  # noqa: ANN001, N802
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content,
                                                                    policy=email_policy)))
        return "250 OK"


@pytest.fixture(scope="module")
def smtp():
    inbox = Inbox()
    port = free_port()
    c = Controller(inbox, hostname="127.0.0.1", port=port)
    c.start()
    inbox.port = port
    yield inbox
    c.stop()


class Hook(web.RequestHandler):
    def initialize(self, got: list, fail_first: list) -> None:
        self.got, self.fail_first = got, fail_first

    def post(self) -> None:
        if self.fail_first[0] > 0:
            self.fail_first[0] -= 1
            self.set_status(503)
            return
        self.got.append((self.request.headers["Content-Type"], json.loads(self.request.body)))
        self.set_status(204)


async def start_hook(fail_first: int):
    got: list = []
    port = free_port()
    srv = HTTPServer(web.Application([("/hook", Hook, {"got": got,
                                                       "fail_first": [fail_first]})]))
    srv.listen(port, "127.0.0.1")
    return srv, got, f"http://127.0.0.1:{port}/hook"


def notice():
    return build_notice(kind="cancel", actor="root", workload=JOB, at=12.0)


async def test_webhook_is_retried_with_backoff_until_it_answers():
    srv, got, url = await start_hook(fail_first=2)
    try:
        d = NoticeDelivery(backoff=0.01, webhook_tries=4)
        assert await d.post_webhook(url, "bob", notice()) == 3
        assert len(got) == 1
        ctype, body = got[0]
        assert ctype == "application/json"
        assert body == {"user": "bob", **notice().as_json()}
        assert body["title"] == ("Your job “train” (project lattice) was cancelled by an "
                                 "administrator")
        assert body["details"]["workload"] == "0f3a9c"
    finally:
        srv.stop()


async def test_webhook_that_keeps_failing_is_given_up_with_the_error():
    srv, got, url = await start_hook(fail_first=10)
    try:
        d = NoticeDelivery(backoff=0.01, webhook_tries=3)
        with pytest.raises(DeliveryFailed) as e:
            await d.post_webhook(url, "bob", notice())
        assert (e.value.channel, e.value.tries, e.value.error) == ("webhook", 3,
                                                                   "HTTP 503 Service Unavailable")
        assert got == []
    finally:
        srv.stop()


async def test_email_goes_through_the_smtp_relay(smtp):
    d = NoticeDelivery(smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_from="gpu@example.org")
    before = len(smtp.messages)
    assert await d.send_email("bob@example.org", notice()) == 1
    rcpt, msg = smtp.messages[before]
    assert rcpt == ["bob@example.org"]
    assert msg["Subject"] == notice().title and msg["From"] == "gpu@example.org"
    text = msg.get_content()
    assert notice().body in text and "workload: 0f3a9c" in text


async def test_email_without_a_relay_fails_clearly():
    with pytest.raises(DeliveryFailed, match="no SMTP relay configured"):
        await NoticeDelivery().send_email("bob@example.org", notice())


@pytest.mark.parametrize(("body", "field"), [
    ({"webhook": "ftp://example.org/x"}, "webhook"),
    ({"webhook": "http://["}, "webhook"),
    ({"webhook": "http://example.org:99999/"}, "webhook"),
    ({"webhook": "http://exa mple.org/"}, "webhook"),
    ({"webhook": 3}, "webhook"),
    ({"email": "bob@localhost"}, "email"),
    ({"email": "bob"}, "email"),
    ({"phone": "123"}, "phone"),
    (["webhook"], None),
])
def test_bad_preference_is_refused_naming_the_field(body, field):
    with pytest.raises(ApiError) as e:
        check_pref(body)
    assert e.value.status == 400 and e.value.field == field


def test_webhook_hosts_keep_webhooks_to_the_listed_hosts():
    d = NoticeDelivery(webhook_hosts=["chat.example.org", ".alerts.example.org"])
    d.check_webhook_host("https://chat.example.org/hooks/1")
    d.check_webhook_host("https://pager.alerts.example.org/x")
    for bad in ("http://127.0.0.1:8081/hub/api", "https://evilchat.example.org/",
                "https://alerts.example.org.evil.net/"):
        with pytest.raises(ApiError) as e:
            d.check_webhook_host(bad)
        assert e.value.field == "webhook"
    NoticeDelivery().check_webhook_host("http://127.0.0.1/")  # no list: any host


BUDGETS = "accounts: {lab: {grant: 10, children: {lattice: {grant: 10, members: [bob]}}}}"


async def test_round_delivers_records_failures_and_moves_on(tmp_path, smtp):
    """A round sends each new notice once, records the unreachable webhook's failure and
    still mails the notice; the next round sends nothing again."""
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    upgrade(url)
    led = Ledger(connect(url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), 1.0)
        assert led.get_state(MARK) == "0"  # the migration starts delivery from here
        w = led.submit(project="lattice", user="bob", kind="batch",
                       request={"kind": "gpu", "gpus": 1}, now=2.0, name="train")
        dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
        set_pref(led, "bob", dead, "bob@example.org", 3.0)
        led.record_decision(now=4.0, kind="cancel", workload=w.id, actor="root")
        led.record_decision(now=4.5, kind="start", workload=w.id)  # not a notice
        d = NoticeDelivery(smtp_host="127.0.0.1", smtp_port=smtp.port, backoff=0.01,
                           webhook_tries=2, webhook_timeout=2)
        before = len(smtp.messages)
        assert await d.round(led, 5.0) == 1
        assert len(smtp.messages) == before + 1
        assert smtp.messages[-1][1]["Subject"] == ("Your job “train” (project lattice) was "
                                                   "cancelled by an administrator")
        fails = failures_of(led, "bob")
        assert len(fails) == 1 and fails[0]["channel"] == "webhook" and fails[0]["tries"] == 2
        assert "Connection refused" in fails[0]["error"] or "Errno" in fails[0]["error"]
        audit = N.audit(led, kinds=["notice-failed"])  # the admins' audit log has it
        assert [(a.actor, a.workload, a.detail["channel"]) for a in audit] == [
            ("delivery:bob", w.id, "webhook")]
        assert "notice-failed" in N.AUDIT_KINDS
        assert [d.kind for d, _ in led.notices_for("bob")] == ["cancel"]  # still stored
        assert await d.round(led, 6.0) == 0  # once
        assert len(smtp.messages) == before + 1
    finally:
        led.dispose()


def wait_for(pred, what, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_service_unreachable_webhook_changes_nothing_else(hub, tokens, tmp_path, smtp):
    """In the real service: bob's webhook is unreachable. An admin cancels bob's job: the
    notice is stored and shown in words, mailed through the relay, the webhook's failure is
    on bob's settings — and the next job still starts. A job stopped at its time limit gets
    its notice too (once); bob's own cancel gets none."""
    svc = ServiceProc(hub, tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}", extra_args=[
        "--NoticeDelivery.interval=0.2", "--NoticeDelivery.backoff=0.05",
        "--NoticeDelivery.webhook_tries=2", "--NoticeDelivery.smtp_host=127.0.0.1",
        f"--NoticeDelivery.smtp_port={smtp.port}"])
    svc.start()
    try:
        bob, root = tokens["bob"], tokens["root"]
        st, body = http("PUT", svc.api + "/notices/settings", bob, {"webhook": "ftp://x"})
        assert st == 400 and body["field"] == "webhook"
        assert http("GET", svc.api + "/notices/settings", bob)[1]["webhook"] is None
        dead = f"http://127.0.0.1:{free_port()}/hook"
        st, body = http("PUT", svc.api + "/notices/settings", bob,
                        {"webhook": dead, "email": "bob@example.org"})
        assert st == 200 and body["webhook"] == dead and body["email_available"]
        before = len(smtp.messages)
        st, job = http("POST", svc.api + "/jobs", bob, {
            "command": ["/bin/sleep", "60"], "project": "lattice", "gpus": 2, "name": "train"})
        assert st == 201
        wait_for(lambda: http("GET", f"{svc.api}/workloads/{job['id']}", bob)[1]["state"]
                 == "running", "the job to start")
        assert http("DELETE", f"{svc.api}/jobs/{job['id']}", root)[0] == 200
        got = wait_for(lambda: len(smtp.messages) > before and smtp.messages[-1], "the e-mail")
        assert got[1]["Subject"] == ("Your job “train” (project lattice) was cancelled by an "
                                     "administrator")
        fails = wait_for(lambda: http("GET", svc.api + "/notices/settings", bob)[1]
                         ["failures"], "the webhook failure")
        assert fails[0]["channel"] == "webhook" and fails[0]["workload"] == job["id"]
        notices = http("GET", svc.api + "/notices", bob)[1]["notices"]
        assert notices[0]["title"] == got[1]["Subject"]
        assert notices[0]["details"]["workload"] == job["id"]
        assert job["id"] not in notices[0]["body"]
        st, nxt = http("POST", svc.api + "/jobs", bob, {
            "command": ["/bin/sleep", "60"], "project": "lattice", "gpus": 2, "name": "next"})
        assert st == 201
        wait_for(lambda: http("GET", f"{svc.api}/workloads/{nxt['id']}", bob)[1]["state"]
                 == "running", "the next job to start")
        # a job stopped at its time limit (the local launcher enforces it): one notice
        assert http("DELETE", f"{svc.api}/jobs/{nxt['id']}", bob)[0] == 200  # hers: no notice
        st, short = http("POST", svc.api + "/jobs", bob, {
            "command": ["/bin/sleep", "60"], "project": "lattice", "gpus": 1,
            "time_limit": "2s", "name": "short"})
        assert st == 201
        wait_for(lambda: http("GET", f"{svc.api}/workloads/{short['id']}", bob)[1]["state"]
                 == "timeout", "the time limit")
        title = "Your job “short” (project lattice) reached its time limit"
        wait_for(lambda: smtp.messages[-1][1]["Subject"] == title, "the time-limit e-mail")
        notices = http("GET", svc.api + "/notices", bob)[1]["notices"]
        assert [(n["kind"], n["title"]) for n in notices[:2]] == [
            ("timeout", title), ("cancel", got[1]["Subject"])]
        # an admin drains the node with a note: the unprotected job is stopped, and its
        # notice (and e-mail) carries the note word for word
        st, long = http("POST", svc.api + "/jobs", bob, {
            "command": ["/bin/sleep", "60"], "project": "lattice", "gpus": 1,
            "name": "long", "resumable": True})
        assert st == 201
        wait_for(lambda: http("GET", f"{svc.api}/workloads/{long['id']}", bob)[1]["state"]
                 == "running", "the long job to start")
        note = "fan replacement, back by 14:00"
        assert http("PUT", f"{svc.api}/nodes/n1/health", root,
                    {"healthy": False, "reason": note})[0] == 200
        title = "Your job “long” (project lattice) was stopped: its node is being drained"
        wait_for(lambda: smtp.messages[-1][1]["Subject"] == title, "the drain e-mail")
        assert f"The administrators' note: “{note}”." in smtp.messages[-1][1].get_content()
        n = http("GET", svc.api + "/notices", bob)[1]["notices"][0]
        assert (n["kind"], n["cause"], n["title"]) == ("preempt", "drain", title)
        assert "It is back in the queue" in n["body"] and long["id"] not in n["body"]
        assert http("DELETE", svc.api + "/notices/settings", bob)[1]["webhook"] is None
    finally:
        cleanup(svc, tokens["root"])
