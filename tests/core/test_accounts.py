"""The budgets YAML: what loads, and every kind of bad input named by path and line."""

import textwrap

import pytest

from jupyter_gpubudget.core.accounts import BudgetError, load_budgets
from jupyter_gpubudget.core.model import DAY, HOUR

GOOD = textwrap.dedent("""\
    window: 14d
    admins: [root]
    policy:
      min_runtime_cap: {interactive: 4h}
      max_reservations: 3
      short_lane_hold: 2
      mig_first: false
      mps_on_mig: false
      short_lane_patience: 5m
      short_lane_late_cost: 0.5
      gang_overdue_after: 2h
      backfill_lease: 30m
      finish_drain_ratio: 2
      finish_drain_budget: 0.01
      gang_on_mig: false
      gang_on_mig_spare: 1
      max_pending_per_user: 25
    accounts:
      physics:
        grant: 1000
        managers: [alice]
        children:
          lattice: {grant: 600, members: [bob, carol]}
          astro: {share: 40%, members: dave}
      bio:
        share: 25%
        children:
          genomics: {members: [erin]}
      proteins:
        parent: bio
        grant: 10
""")


def test_policy_interconnect_per_kind():
    b = load_budgets("policy:\n  interconnect: {batch: any, interactive: node}\n"
                     "accounts: {a: {grant: 1}}\n")
    assert b.policy.interconnect_for("batch") == "any"
    assert b.policy.interconnect_for("interactive") == "node"
    assert b.policy.interconnect_for("debug") is None
    with pytest.raises(BudgetError, match="interconnect: expected one of nvlink, node, any"):
        load_budgets("policy:\n  interconnect: {batch: infiniband}\naccounts: {a: {grant: 1}}\n")
    with pytest.raises(BudgetError):
        load_budgets("policy:\n  interconnect: {gpu: any}\naccounts: {a: {grant: 1}}\n")


def test_good_file_loads_tree_policy_and_people():
    b = load_budgets(GOOD, "budgets.yaml")
    t = b.accounts
    assert t.roots == ("physics", "bio")
    assert sorted(t.projects()) == ["astro", "genomics", "lattice", "proteins"]
    assert t.path("lattice") == ("physics", "lattice")
    assert t.get("proteins").parent == "bio"
    assert b.policy.window == 14 * DAY
    assert b.policy.cap_for("interactive") == 4 * HOUR
    assert b.policy.cap_for("batch") == 2 * DAY  # default kept
    assert b.policy.max_reservations == 3
    assert b.policy.short_lane_hold == 2
    assert (b.policy.mig_first, b.policy.mps_on_mig) == (False, False)  # defaults: on
    assert (b.policy.short_lane_patience, b.policy.short_lane_late_cost) == (300.0, 0.5)
    assert b.policy.gang_overdue_after == 2 * HOUR
    assert (b.policy.gang_on_mig, b.policy.gang_on_mig_spare) == (False, 1)
    plain = load_budgets("accounts: {a: {grant: 1}}").policy
    assert plain.gang_overdue_after == 0  # off
    # leases of reserved GPUs: off by default, as the budgets file says
    assert (b.policy.backfill_lease, plain.backfill_lease) == (30 * 60, 0)
    assert load_budgets("policy: {backfill_lease: 1h}\naccounts: {a: {grant: 1}}\n"
                        ).policy.backfill_lease == HOUR
    assert load_budgets("policy: {backfill_lease: 0}\naccounts: {a: {grant: 1}}\n"
                        ).policy.backfill_lease == 0  # off
    # drains finished by preemption: on by default at 4, within a loss budget
    # of 0.7 % of the cluster's GPU-hours a day; a ratio of 0 turns it off
    assert (b.policy.finish_drain_ratio, plain.finish_drain_ratio) == (2.0, 4.0)
    assert (b.policy.finish_drain_budget, plain.finish_drain_budget) == (0.01, 0.009)
    assert load_budgets("policy: {finish_drain_ratio: 0}\naccounts: {a: {grant: 1}}\n"
                        ).policy.finish_drain_ratio == 0  # off
    # off by default: only gangs that declared ``interconnect: any`` may use them
    assert (plain.gang_on_mig, plain.gang_on_mig_spare) == (False, 2)
    assert plain.interconnect == () and plain.interconnect_for("batch") is None
    assert (b.policy.max_pending_per_user, plain.max_pending_per_user) == (25, 100)
    assert b.admins == {"root"}
    grants = t.effective_grants(cluster_gpu_hours=8000)
    assert grants["astro"] == pytest.approx(400)
    assert grants["bio"] == pytest.approx(2000)  # 25 % of the cluster
    assert grants["genomics"] == 0
    assert t.projects_of("alice") == ["lattice", "astro"]  # manager of the program
    assert t.projects_of("bob") == ["lattice"]
    assert t.can_manage("alice", "astro") and not t.can_manage("bob", "lattice")


def test_half_life_replaces_window():
    b = load_budgets("half_life: 3d\naccounts: {a: {grant: 1}}\n")
    assert b.policy.half_life == 3 * DAY


BAD = [
    # (yaml, expected path, expected line, words in the message)
    ("accounts:\n  a:\n    grant: 10\n    colour: red\n", "accounts.a.colour", 4, "unknown key"),
    ("accounts:\n  a:\n    grant: -5\n", "accounts.a.grant", 3, "negative"),
    ("accounts:\n  a:\n    grant: lots\n", "accounts.a.grant", 3, "expected a number"),
    ("accounts:\n  a:\n    grant: .nan\n", "accounts.a.grant", 3, "finite"),
    ("accounts:\n  a:\n    children:\n      x: {grant: 1}\n  b:\n    children:\n      x: {grant: 2}\n",
     "accounts.b.children.x", 7, "duplicate account name"),
    ("accounts:\n  a: {grant: 1}\n  a: {grant: 2}\n", "accounts.a", 3, "duplicate key"),
    ("accounts:\n  a: {parent: b}\n  b: {parent: a}\n", "accounts.", None, "cycle"),
    ("accounts:\n  a:\n    children:\n      x: {share: 60%}\n      y: {share: 50%}\n",
     "accounts.a.children.y.share", 5, "over 100%"),
    ("accounts:\n  a: {share: 140%}\n", "accounts.a.share", 2, "between 0% and 100%"),
    ("accounts:\n  a: {grant: 1, share: 10%}\n", "accounts.a.share", 2, "not both"),
    ("accounts:\n  a: {parent: nowhere}\n", "accounts.a.parent", 2, "not a defined account"),
    ("window: soon\naccounts: {a: {grant: 1}}\n", "window", 1, "duration"),
    ("window: 0\naccounts: {a: {grant: 1}}\n", "window", 1, "longer than zero"),
    ("policy: {short_lane_hold: 1.5}\naccounts: {a: {grant: 1}}\n", "policy.short_lane_hold", 1,
     "whole number"),
    ("grants: 5\naccounts: {a: {grant: 1}}\n", "grants", 1, "unknown key"),
    ("policy: {max_pending_per_user: -1}\naccounts: {a: {grant: 1}}\n",
     "policy.max_pending_per_user", 1, "must be ≥ 0"),
    ("policy: {max_pending_per_user: 2.5}\naccounts: {a: {grant: 1}}\n",
     "policy.max_pending_per_user", 1, "whole number"),
    ("policy: {max_pending_per_user: many}\naccounts: {a: {grant: 1}}\n",
     "policy.max_pending_per_user", 1, "expected a number"),
    ("accounts:\n  a: {grant: 1, members: [bob, 7]}\n", "accounts.a.members[1]", 2, "string"),
    ("accounts:\n  'bad name!': {grant: 1}\n", "accounts.bad name!", 2, "account name"),
    ("accounts: {}\n", "accounts", 1, "at least one account"),
    ("accounts:\n  a: {grant: 1\n", "", None, "not valid YAML"),
    ("", "", 1, "empty"),
    ("policy: {min_runtime_cap: {gpu: 4h}}\naccounts: {a: {grant: 1}}\n",
     "policy.min_runtime_cap.gpu", 1, "unknown key"),
    ("accounts:\n  a: {grant: true}\n", "accounts.a.grant", 2, "expected a number"),
    ("a: &x [*x]\n", "", None, "alias"),
    ("policy: {placement: spread}\naccounts: {a: {grant: 1}}\n", "policy.placement", 1,
     "'fgd' or 'pack'"),
    ("policy: {preemption_margin: -1}\naccounts: {a: {grant: 1}}\n",
     "policy.preemption_margin", 1, "must be ≥ 0"),
    ("policy: {short_lane_late_cost: -1}\naccounts: {a: {grant: 1}}\n",
     "policy.short_lane_late_cost", 1, "must be ≥ 0"),
    ("policy: {mps_on_mig: maybe}\naccounts: {a: {grant: 1}}\n", "policy.mps_on_mig", 1,
     "true or false"),
    ("policy: {short_lane_patience: soon}\naccounts: {a: {grant: 1}}\n",
     "policy.short_lane_patience", 1, "duration"),
    ("policy:\n  gang_overdue_after: late\naccounts: {a: {grant: 1}}\n",
     "policy.gang_overdue_after", 2, "duration"),
    ("policy:\n  backfill_lease: soon\naccounts: {a: {grant: 1}}\n",
     "policy.backfill_lease", 2, "duration"),
    ("policy:\n  finish_drain_ratio: -1\naccounts: {a: {grant: 1}}\n",
     "policy.finish_drain_ratio", 2, "must be ≥ 0, got -1"),
    ("policy:\n  finish_drain_ratio: lots\naccounts: {a: {grant: 1}}\n",
     "policy.finish_drain_ratio", 2, "number"),
    ("policy:\n  finish_drain_budget: -0.1\naccounts: {a: {grant: 1}}\n",
     "policy.finish_drain_budget", 2, "must be ≥ 0, got -0.1"),
    ("policy:\n  finish_drain_budget: 2\naccounts: {a: {grant: 1}}\n",
     "policy.finish_drain_budget", 2, "≤ 1"),
]


@pytest.mark.parametrize(("text", "path", "line", "words"), BAD,
                         ids=[(b[3] + "@" + b[1]).encode("ascii", "replace").decode()
                              for b in BAD])  # ASCII ids: mutmut passes them back to pytest
def test_bad_budgets_name_path_and_line(text, path, line, words):
    with pytest.raises(BudgetError) as info:
        load_budgets(text, "budgets.yaml")
    err = info.value
    assert words in err.message
    assert err.path.startswith(path)
    if line is not None:
        assert err.line == line
    assert str(err).startswith("budgets.yaml")


def test_bad_kinds_are_at_least_ten():
    assert len({b[3] for b in BAD}) >= 10


def test_a_grant_in_the_budgets_file_is_a_sensible_number_of_gpu_hours():
    """-0.0, a subnormal and a finer step than 0.001 are refused, naming the line (attacks)."""
    from jupyter_gpubudget.core.accounts import grant_in_steps

    for bad in ("-0.0", "1.0e-320", "12.0005"):
        with pytest.raises(BudgetError) as e:
            load_budgets(f"accounts:\n  a: {{grant: {bad}, members: [x]}}\n", "b.yaml")
        assert "b.yaml:2" in str(e.value) and "grant" in str(e.value), str(e.value)
    assert load_budgets("accounts:\n  a: {grant: 12.125, members: [x]}\n", "b.yaml") \
        .accounts.accounts["a"].grant_hours == 12.125
    assert grant_in_steps(0.0) and grant_in_steps(1e9) and not grant_in_steps(float("nan"))
