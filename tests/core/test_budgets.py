"""The budgets YAML and the account tree by hand (semantics 8: errors name the field and the
line; semantics 3: grants are the fair-share weights): every policy key, every error word for
word, and what the tree answers."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import (
    MAX_GRANT_HOURS,
    MAX_TREE_DEPTH,
    Account,
    AccountTree,
    BudgetError,
    load_budgets,
)
from jupyter_gpubudget.core.model import DAY, HOUR, Policy


def bad(text: str) -> BudgetError:
    with pytest.raises(BudgetError) as info:
        load_budgets(text, "b.yaml")
    return info.value


ONE = "accounts: {a: {grant: 1}}\n"


def test_every_policy_key_is_read():
    b = load_budgets("""
policy:
  min_runtime_cap: {interactive: 2h, debug: 10m}
  default_runtime: 30m
  max_reservations: 0
  backfill: false
  preemption: false
  preemption_margin: 0.5
  checkpoint_interval: 10m
  restart_overhead: 45
  preemption_toll: 0.1
  short_lane_cost: 0.2
  short_lane: 15m
  whole_gpu_on_mig: false
  placement: pack
  stop_grace: 5m
accounts: {a: {grant: 1}}
""")
    p = b.policy
    assert p.min_runtime_cap == (("batch", 2 * DAY), ("debug", 600.0), ("interactive", 2 * HOUR))
    assert (p.default_runtime, p.max_reservations, p.backfill, p.preemption) == (
        1800.0, 0, False, False)
    assert (p.preemption_margin, p.checkpoint_interval, p.restart_overhead) == (0.5, 600.0, 45.0)
    assert (p.preemption_toll, p.short_lane_cost, p.short_lane) == (0.1, 0.2, 900.0)
    assert (p.whole_gpu_on_mig, p.placement, p.stop_grace) == (False, "pack", 300.0)
    assert p.window == 7 * DAY and p.half_life is None
    d = load_budgets(ONE).policy
    assert d == Policy() and load_budgets(ONE).admins == frozenset()
    on = load_budgets("policy: {backfill: true, preemption: true, whole_gpu_on_mig: true, "
                      "placement: fgd}\n" + ONE).policy
    assert (on.backfill, on.preemption, on.whole_gpu_on_mig, on.placement) == (
        True, True, True, "fgd")


def test_window_and_half_life():
    assert load_budgets("window: 2d\n" + ONE).policy.window == 2 * DAY
    p = load_budgets("half_life: 1d\n" + ONE).policy
    assert (p.half_life, p.window) == (DAY, 10 * DAY)  # the window reaches 10 half-lives
    p = load_budgets("half_life: 1h\n" + ONE).policy
    assert (p.half_life, p.window) == (HOUR, 7 * DAY)  # never shorter than the default
    e = bad("window: 1d\nhalf_life: 1d\n" + ONE)
    assert (e.message, e.path, e.line) == ("give either 'window' or 'half_life', not both",
                                           "half_life", 2)
    assert bad("half_life: 0\n" + ONE).message == "the half-life must be longer than zero"
    assert bad("window: 0s\n" + ONE).message == "the window must be longer than zero"


def test_policy_errors_word_for_word():
    for text, path, msg in [
        ("default_runtime: 0", "policy.default_runtime", "must be longer than zero"),
        ("max_reservations: 1.5", "policy.max_reservations", "expected a whole number, got 1.5"),
        ("max_reservations: -1", "policy.max_reservations", "must be ≥ 0, got -1"),
        ("backfill: 1", "policy.backfill", "expected true or false, got int 1"),
        ("preemption_toll: -0.5", "policy.preemption_toll", "must be ≥ 0, got -0.5"),
        ("short_lane_cost: -1", "policy.short_lane_cost", "must be ≥ 0, got -1"),
        ("gang_on_mig: yes please", "policy.gang_on_mig",
         "expected true or false, got str 'yes please'"),
        ("mps_mig_first: sometimes", "policy.mps_mig_first",
         "expected true or false, got str 'sometimes'"),
        ("gang_on_mig_spare: -1", "policy.gang_on_mig_spare", "must be ≥ 0, got -1"),
        ("gang_on_mig_spare: 0.5", "policy.gang_on_mig_spare", "expected a whole number, got 0.5"),
        ("placement: spread", "policy.placement", "placement must be 'fgd' or 'pack', got "
         "'spread'"),
        ("min_runtime_cap: {gpu: 1h}", "policy.min_runtime_cap.gpu",
         "unknown key 'gpu' (allowed: batch, debug, interactive)"),
        ("colour: red", "policy.colour", "unknown key 'colour' (allowed: backfill, "
         "backfill_lease, checkpoint_interval, default_runtime, finish_drain_budget, "
         "finish_drain_ratio, gang_on_mig, "
         "gang_on_mig_spare, gang_overdue_after, interconnect, manager_booking_limit, "
         "managers_fund_own_projects, max_pending_per_user, max_reservations, "
         "max_starts_per_cycle, mig_first, "
         "min_runtime_cap, "
         "mps_mig_first, mps_on_mig, off_peak, placement, preemption, preemption_margin, "
         "preemption_toll, reservation_idle_charge, "
         "restart_overhead, short_lane, short_lane_cost, short_lane_hold, "
         "short_lane_late_cost, short_lane_patience, stop_grace, whole_gpu_on_mig)"),
        ("manager_booking_limit: -2", "policy.manager_booking_limit", "must be ≥ 0, got -2"),
        ("stop_grace: -1", "policy.stop_grace", None),
    ]:
        e = bad(f"policy:\n  {text}\n" + ONE)
        if msg is None:  # the duration reader's own wording
            assert (e.path, e.line) == (path, 2), text
            continue
        assert (e.message, e.path, e.line) == (msg, path, 2), text


def test_accounts_errors_word_for_word():
    cases = [
        ("accounts: {}\n", "accounts", 1, "there must be at least one account"),
        ("window: 1d\n", "", 1, "missing required key 'accounts'"),
        ("accounts:\n  a: {grant: 1, share: 5%}\n", "accounts.a.share", 2,
         "give either 'grant' (GPU-hours) or 'share' (percent), not both"),
        ("accounts:\n  a: {grant: -1}\n", "accounts.a.grant", 2,
         "a grant cannot be negative, got -1"),
        (f"accounts:\n  a: {{grant: {MAX_GRANT_HOURS * 10:.0f}}}\n", "accounts.a.grant", 2,
         "must be ≤ 1e+09, got 1e+10"),
        ("accounts:\n  a: {share: 5}\n  b: {share: 96}\n", "accounts.b.share", 3,
         "shares of the top-level accounts add up to 101% (over 100%)"),
        ("accounts:\n  p:\n    children:\n      a: {share: 50%}\n      b: {share: 50.5%}\n",
         "accounts.p.children.b.share", 5,
         "shares of the children of 'p' add up to 100.5% (over 100%)"),
        ("accounts:\n  a: {share: '30'}\n", "accounts.a.share", 2,
         "expected a percent such as '30%', got '30'"),
        ("accounts:\n  a: {share: 'x%'}\n", "accounts.a.share", 2,
         "expected a percent such as '30%', got 'x%'"),
        ("accounts:\n  a: {share: true}\n", "accounts.a.share", 2,
         "expected a percent such as '30%', got True"),
        ("accounts:\n  a: {share: -1%}\n", "accounts.a.share", 2,
         "a share must be between 0% and 100%, got -1%"),
        ("accounts:\n  a: {share: 100.5}\n", "accounts.a.share", 2,
         "a share must be between 0% and 100%, got 100.5%"),
        ("accounts:\n  'a b': {grant: 1}\n", "accounts.a b", 2,
         "account name 'a b' must be letters, digits, '-', '_' or '.'"),
        ("accounts:\n  a: {children: [x]}\n", "accounts.a.children", 2,
         "expected a mapping of child accounts"),
        ("accounts:\n  a: {grant: 1}\n  b:\n    children:\n      a: {grant: 2}\n",
         "accounts.b.children.a", 5, "duplicate account name 'a' (also defined at line 2)"),
        ("accounts:\n  a: {parent: zz}\n", "accounts.a.parent", 2,
         "parent 'zz' is not a defined account"),
        ("accounts:\n  p: {children: {a: {parent: q}}}\n  q: {grant: 1}\n",
         "accounts.p.children.a.parent", 2, "parent 'q' contradicts the nesting under 'p'"),
        ("accounts:\n  a: {parent: b}\n  b: {parent: c}\n  c: {parent: a}\n",
         "accounts.a.parent", 2, "accounts form a cycle: a -> b -> c -> a"),
        ("accounts:\n  a: {parent: a}\n", "accounts.a.parent", 2,
         "accounts form a cycle: a -> a"),
        ("admins: [1]\n" + ONE, "admins[0]", 1, "expected a non-empty string, got int 1"),
    ]
    for text, path, line, msg in cases:
        e = bad(text)
        assert (e.message, e.path, e.line, e.source) == (msg, path, line, "b.yaml"), text


def test_the_tree_may_be_deep_but_not_deeper_than_the_limit():
    def chain(n: int) -> str:
        lines = ["accounts:", "  a0: {grant: 1}"]
        lines += [f"  a{i}: {{parent: a{i - 1}}}" for i in range(1, n)]
        return "\n".join(lines) + "\n"

    t = load_budgets(chain(MAX_TREE_DEPTH)).accounts
    assert len(t.path(f"a{MAX_TREE_DEPTH - 1}")) == MAX_TREE_DEPTH
    e = bad(chain(MAX_TREE_DEPTH + 1))
    assert e.message == f"the account tree is deeper than 32 levels at 'a{MAX_TREE_DEPTH}'"
    assert e.path == f"accounts.a{MAX_TREE_DEPTH}.parent"


def test_the_tree_answers():
    b = load_budgets("""
admins: root
accounts:
  phys:
    grant: 100
    managers: [mia]
    members: [pat]
    children:
      x: {share: 25%, members: [xav]}
      y: {members: [yan], managers: [yo]}
  grp:
    children:
      g1: {grant: 30}
      g2: {share: 10%}
  solo: {share: 50%}
""")
    t = b.accounts
    assert b.admins == {"root"}
    assert t.roots == ("phys", "grp", "solo")
    assert t.projects() == ["x", "y", "g1", "g2", "solo"]
    assert t.is_project("x") and not t.is_project("phys") and not t.is_project("zz")
    assert "x" in t and "zz" not in t
    assert t.get("x") == Account("x", "phys", None, 25.0, frozenset({"xav"}), frozenset(),
                                 (), 9)
    assert t.get("phys").children == ("x", "y")
    assert t.path("g2") == ("grp", "g2")
    g = t.effective_grants(1000.0)
    # x: 25 % of its parent's 100; y: nothing; grp: its children's grants (g1's 30; g2's
    # share is of grp, so it does not add); g2: 10 % of 30; solo: 50 % of the cluster
    assert g == {"phys": 100.0, "x": 25.0, "y": 0.0, "grp": 30.0, "g1": 30.0, "g2": 3.0,
                 "solo": 500.0}
    assert t.projects_of("pat") == ["x", "y"] and t.projects_of("mia") == ["x", "y"]
    assert t.projects_of("yo") == ["y"] and t.projects_of("xav") == ["x"]
    assert t.projects_of("nobody") == []
    assert t.can_manage("mia", "x") and t.can_manage("yo", "y")
    assert not t.can_manage("yo", "x") and not t.can_manage("pat", "x")
    t2 = t.with_grant("y", 7.0)
    assert t2.effective_grants(1000.0)["y"] == 7.0 and t.effective_grants(1000.0)["y"] == 0.0
    assert t2.path("y") == ("phys", "y") and t2.roots == t.roots
    t3 = t.with_grant("x", None, 50.0)
    assert t3.effective_grants(1000.0)["x"] == 50.0
    assert t3.get("x").members == {"xav"}


def test_a_flat_file_with_parents_is_the_same_tree():
    flat = load_budgets("""
accounts:
  p: {grant: 10}
  a: {parent: p, grant: 4}
  b: {parent: p, grant: 6}
""").accounts
    assert flat.get("p").children == ("a", "b") and flat.path("b") == ("p", "b")
    assert AccountTree(dict(flat.accounts), flat.roots).path("a") == ("p", "a")
    assert load_budgets(b"accounts: {a: {grant: 2}}\n").accounts.get("a").grant_hours == 2.0


def test_depth_counts_whatever_the_order_and_nesting():
    # listed from the bottom up: the first account walked holds the whole chain
    n = MAX_TREE_DEPTH + 1
    lines = ["accounts:"] + [f"  a{i}: {{parent: a{i - 1}}}" for i in range(n - 1, 0, -1)]
    lines.append("  a0: {grant: 1}")
    e = bad("\n".join(lines) + "\n")
    assert (e.message, e.path, e.line) == (
        f"the account tree is deeper than 32 levels at 'a{n - 1}'", f"accounts.a{n - 1}.parent",
        2)
    ok = ["accounts:"] + [f"  a{i}: {{parent: a{i - 1}}}" for i in range(n - 2, 0, -1)]
    t = load_budgets("\n".join([*ok, "  a0: {grant: 1}"]) + "\n").accounts
    assert len(t.path(f"a{n - 2}")) == MAX_TREE_DEPTH
    # half flat, half nested: depths already known are built on
    flat = ["accounts:", "  b0: {grant: 1}"] + [f"  b{i}: {{parent: b{i - 1}}}"
                                                 for i in range(1, 16)]
    nested, indent = [], "  "
    nested.append(f"{indent}c0:\n{indent}  parent: b15\n{indent}  children:")
    for i in range(1, 17):
        indent += "    "
        nested.append(f"{indent}c{i}:" + ("\n" + indent + "  children:" if i < 16 else
                                          " {grant: 1}"))
    e = bad("\n".join(flat + nested) + "\n")
    assert e.message == "the account tree is deeper than 32 levels at 'c16'"
    assert (e.path, e.line) == ("accounts.c0.children.c1.children.c2.children.c3.children.c4."
                                "children.c5.children.c6.children.c7.children.c8.children.c9."
                                "children.c10.children.c11.children.c12.children.c13.children."
                                "c14.children.c15.children.c16", 51)


def test_shares_at_their_bounds():
    b = load_budgets("accounts:\n  a: {share: 0%}\n  b: {share: 0.5%}\n  c: {share: 99.5%}\n"
                     "  d: {grant: 5}\n")
    assert [b.accounts.get(x).share_pct for x in "abc"] == [0.0, 0.5, 99.5]
    assert load_budgets("accounts:\n  a: {share: 100%}\n").accounts.get("a").share_pct == 100.0
    assert load_budgets("accounts:\n  a: {share: 60%}\n  b: {share: 40%}\n").accounts.get(
        "b").share_pct == 40.0
    # the share that tips the sum over is the last one written, whatever the names
    e = bad("accounts:\n  b: {share: 60%}\n  a: {share: 50%}\n")
    assert (e.message, e.path, e.line) == (
        "shares of the top-level accounts add up to 110% (over 100%)", "accounts.a.share", 3)
    assert str(load_budgets_error("accounts: {}\n")).startswith("<budgets>:1: accounts: ")


def load_budgets_error(text: str) -> BudgetError:
    with pytest.raises(BudgetError) as info:
        load_budgets(text)
    return info.value


def test_the_shortest_window_and_half_life():
    assert load_budgets("window: 1\n" + ONE).policy.window == 1.0
    p = load_budgets("half_life: 1\n" + ONE).policy
    assert (p.half_life, p.window) == (1.0, 7 * DAY)
