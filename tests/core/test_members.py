"""Fairness inside a project and members' limits (docs/core.md, "Fairness inside a project").

Properties: a member past their limit is never backed (a) — checked against usage and running
GPUs recounted from the charges and the decisions alone, never from the scheduler's own
bookkeeping — and, inside one project, with equal requests, the member with less recent
usage starts first (b)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.accounts import BudgetError, MemberLimit, load_budgets
from jupyter_gpubudget.core.members import limit_problem, over_limit_words, valid_user_name
from jupyter_gpubudget.core.model import HOUR, MILLI, ChargeInterval, Policy, Preempt, Start
from jupyter_gpubudget.core.ranking import rank
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule
from jupyter_gpubudget.core.usage import interval_usage

from .helpers import inventory, job, prop_settings

LIMITED = """
accounts:
  lab:
    grant: 100000
    children:
      a:
        grant: 100000
        members: [ann, bob]
        member_limits: {{bob: {{{limits}}}}}
"""

EQUAL = """
accounts:
  lab:
    grant: 100000
    children:
      a: {grant: 100000, members: [ann, bob]}
"""

NOW = 10 * 24 * HOUR
POLICY = Policy(window=7 * 24 * HOUR)


def _limits(gpu_hours: float | None, gpus: int | None) -> str:
    parts = ([f"gpu_hours: {gpu_hours}"] if gpu_hours is not None else []) + (
        [f"gpus: {gpus}"] if gpus is not None else [])
    return ", ".join(parts)


def _usage(charges: list[ChargeInterval], user: str, now: float) -> float:
    return sum(interval_usage(c.milli, c.start, now if c.end is None else c.end, now, POLICY)
               for c in charges if c.user == user)


@st.composite
def limited_runs(draw):
    gpu_hours = draw(st.one_of(st.none(), st.integers(0, 60)))
    gpus = draw(st.one_of(st.none(), st.integers(0, 4))) if gpu_hours is not None \
        else draw(st.integers(0, 4))
    # bob's (and ann's) charges in the window before now: 0-80 GPU-hours each
    charges = []
    for user in ("ann", "bob"):
        for i in range(draw(st.integers(0, 4))):
            hours = draw(st.integers(1, 20))
            end = NOW - draw(st.integers(0, 100)) * HOUR
            charges.append(ChargeInterval(f"old-{user}-{i}", "a", user, MILLI,
                                          end - hours * HOUR, end))
    jobs = []
    for i in range(draw(st.integers(1, 10))):
        user = draw(st.sampled_from(["ann", "bob", "bob"]))
        jobs.append(job(f"j{i}", "a", gpus=draw(st.integers(1, 2)), at=NOW - 100 + i, user=user,
                        min_runtime=draw(st.sampled_from([0.0, HOUR, 10 * HOUR])),
                        kind=draw(st.sampled_from(["batch", "interactive", "debug"]))))
    steps = draw(st.lists(st.tuples(st.integers(0, 20), st.booleans()), max_size=4))
    return gpu_hours, gpus, charges, jobs, steps


@prop_settings(60)
@given(limited_runs())
def test_a_member_past_their_limit_is_never_backed(run):
    gpu_hours, gpus, charges, jobs, steps = run
    accounts = load_budgets(LIMITED.format(limits=_limits(gpu_hours, gpus))).accounts
    inv = inventory(nodes=2, gpus=4)
    s = Scheduler.from_state(ClusterState(accounts, inv, POLICY, pending=jobs, charges=charges))
    # an independent tally from the decisions: bob's charges and his backed running GPUs
    ledger = list(charges)
    running: dict[str, tuple[float, bool, float, str]] = {}  # id -> (gpus, backed, since, user)
    users = {w.id: w.user for w in jobs}
    by_id = {w.id: w for w in jobs}

    def stop(wid: str, at: float) -> None:
        g, _, since, user = running.pop(wid)
        ledger.append(ChargeInterval(wid, "a", user, int(g * MILLI), since, at))

    def check(decisions, at: float) -> None:
        for d in decisions:
            if isinstance(d, Preempt) and d.workload in running:
                stop(d.workload, at)
            if not isinstance(d, Start):
                continue
            g = d.placement.fraction
            if d.backed and users[d.workload] == "bob":
                open_now = [ChargeInterval(w, "a", u, int(f * MILLI), since, None)
                            for w, (f, _, since, u) in running.items()]
                used = _usage(ledger + open_now, "bob", at)
                need = g * POLICY.effective_min_runtime(by_id[d.workload]) / HOUR
                held = sum(f for f, b, _, u in running.values() if b and u == "bob")
                if gpu_hours is not None:
                    assert used + need <= gpu_hours + 1e-6, (d, used, need)
                if gpus is not None:
                    assert held + g <= gpus + 1e-9, (d, held)
            running[d.workload] = (g, d.backed, at, users[d.workload])

    now = NOW
    check(s.cycle(now), now)
    for n, (minutes, submit) in enumerate(steps):
        now += (minutes + 1) * 60
        if running:
            wid = sorted(running)[n % len(running)]
            stop(wid, now)
            check(s.finish(wid, now), now)
        if submit:
            w = job(f"new{n}", "a", at=now, user="bob", min_runtime=HOUR)
            users[w.id], by_id[w.id] = "bob", w
            check(s.submit(w, now), now)
        check(s.cycle(now), now)


def test_past_the_limit_the_work_still_runs_unbacked():
    accounts = load_budgets(LIMITED.format(limits="gpu_hours: 10, gpus: 1")).accounts
    charges = [ChargeInterval("old", "a", "bob", MILLI, NOW - 12 * HOUR, NOW - HOUR)]
    jobs = [job("b1", user="bob", min_runtime=HOUR), job("a1", user="ann", min_runtime=HOUR)]
    out = schedule(ClusterState(accounts, inventory(gpus=4), POLICY, pending=jobs,
                                charges=charges), NOW)
    starts = {d.workload: d for d in out if isinstance(d, Start)}
    assert set(starts) == {"a1", "b1"}  # both run: idle capacity takes unbacked work
    assert starts["a1"].backed and not starts["b1"].backed
    assert starts["b1"].protected_until is None


def test_the_running_gpu_limit_backs_up_to_it_and_no_further():
    accounts = load_budgets(LIMITED.format(limits="gpus: 2")).accounts
    jobs = [job(f"b{i}", user="bob", at=float(i), min_runtime=HOUR) for i in range(4)]
    out = schedule(ClusterState(accounts, inventory(gpus=4), POLICY, pending=jobs), NOW)
    backed = sorted(d.workload for d in out if isinstance(d, Start) and d.backed)
    unbacked = sorted(d.workload for d in out if isinstance(d, Start) and not d.backed)
    assert backed == ["b0", "b1"] and unbacked == ["b2", "b3"]


# ---------------------------------------------------------------- (b) members take turns


@st.composite
def two_members(draw):
    used = draw(st.lists(st.integers(0, 50), min_size=2, max_size=2, unique=True))
    kind = draw(st.sampled_from(["batch", "interactive"]))
    gpus = draw(st.integers(1, 2))
    jobs = []
    for user in ("ann", "bob"):
        for i in range(draw(st.integers(1, 5))):
            jobs.append(job(f"{user}{i}", "a", gpus=gpus, user=user, kind=kind,
                            at=NOW - draw(st.integers(1, 10_000))))
    return dict(zip(("ann", "bob"), used, strict=True)), jobs, gpus


@prop_settings(80)
@given(two_members())
def test_with_equal_requests_the_member_with_less_recent_usage_starts_first(case):
    used, jobs, gpus = case
    accounts = load_budgets(EQUAL).accounts
    charges = [ChargeInterval(f"old-{u}", "a", u, MILLI, NOW - 2 * HOUR - h * HOUR, NOW - 2 * HOUR)
               for u, h in used.items() if h]
    # room for exactly one of the equal requests
    out = schedule(ClusterState(accounts, inventory(gpus=gpus), POLICY, pending=jobs,
                                charges=charges), NOW)
    started = [d.workload for d in out if isinstance(d, Start)]
    lighter = min(used, key=lambda u: used[u])
    assert len(started) == 1 and started[0].startswith(lighter), (used, started)


def test_one_members_hundred_jobs_do_not_starve_a_colleagues_notebook():
    accounts = load_budgets(EQUAL).accounts
    s = Scheduler(accounts, inventory(gpus=1), POLICY)
    st_ = s.standings(NOW)
    jobs = [job(f"b{i}", user="bob", at=float(i)) for i in range(100)]
    jobs.append(job("c1", user="ann", at=1000.0))
    order = [w.id for _, w in rank(jobs, accounts, st_, lambda w: 1.0)]
    # bob's first job went first (the earlier), then ann's: his first is projected as charged
    assert order[:3] == ["b0", "c1", "b1"]


@prop_settings(40)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["ann", "bob"]),
                          st.integers(0, 400), st.integers(0, 100), st.booleans()),
                max_size=12), st.integers(0, 50))
def test_members_usage_adds_up_to_the_projects_in_both_meters(rows, later):
    from jupyter_gpubudget.core.usage import UsageMeter
    from jupyter_gpubudget.sim.fastmeter import IncrementalUsageMeter

    meters = [UsageMeter(POLICY), IncrementalUsageMeter(POLICY)]
    rows = sorted(rows, key=lambda r: r[2] + r[3])  # intervals arrive as they close
    for i, (project, user, start, length, still_open) in enumerate(rows):
        c = ChargeInterval(f"w{i}", project, user, 500,
                           NOW + start * 600, None if still_open else NOW + (start + length) * 600)
        for m in meters:
            m.add(c)
    now = NOW + (500 + later) * 600
    exact = meters[0].split(now)
    for m in meters:
        projects, members = m.split(now)
        assert projects == pytest.approx(exact[0]) and members == pytest.approx(exact[1])
        for p, u in projects.items():
            assert u == pytest.approx(sum(v for (q, _), v in members.items() if q == p))


# ---------------------------------------------------------------- the budgets file


def test_member_limits_load_and_errors_name_the_field():
    tree = load_budgets(LIMITED.format(limits="gpu_hours: 200, gpus: 4")).accounts
    assert tree.member_limit("a", "bob") == MemberLimit(200.0, 4.0)
    assert tree.member_limit("a", "ann") is None
    cleared = tree.with_member_limit("a", "bob", None)
    assert cleared.member_limit("a", "bob") is None and tree.member_limit("a", "bob")
    for limits, words in [("gpu_hours: -1", "gpu_hours: must be a number from 0"),
                          ("gpus: lots", "gpus: expected a number"),
                          ("gpus: 1.0e+300", "gpus: must be a number from 0"),
                          ("gpu_hours: 1.00001", "at most 3 decimals"),
                          ("cpus: 2", "unknown key 'cpus'")]:
        with pytest.raises(BudgetError, match=words) as e:
            load_budgets(LIMITED.format(limits=limits))
        assert "member_limits.bob" in str(e.value) and e.value.line == 9
    with pytest.raises(BudgetError, match="'carol' is not a member of 'a'"):
        load_budgets(LIMITED.replace("{{bob:", "{{carol:").format(limits="gpus: 1"))
    with pytest.raises(BudgetError, match="not a user name"):
        load_budgets(LIMITED.replace("{{bob:", "{{'b b':").format(limits="gpus: 1"))
    with pytest.raises(BudgetError, match="member_limits go on a project"):
        load_budgets("accounts:\n  lab:\n    member_limits: {x: {gpus: 1}}\n"
                     "    children:\n      a: {grant: 1, members: [x]}\n")
    assert not valid_user_name("") and not valid_user_name("-x") and valid_user_name("a.b@c")
    assert limit_problem("gpus", True) and limit_problem("gpus", float("nan"))
    assert "400 digits" in (limit_problem("gpu_hours", 10 ** 399) or "")
    assert over_limit_words("lattice", ("gpu_hours", 212.4, 200.0, 2.0)) == (
        "over your member limit in lattice: 212 of 200 GPU-h — runs unbacked")
    assert over_limit_words("lattice", ("gpus", 3.0, 4.0, 2.0)) == (
        "past your member limit in lattice with this: 3 of 4 GPUs running, 2 more GPUs — "
        "runs unbacked")
