"""The account tree (programs → projects, any depth) and the budgets YAML that defines it.

A budgets file looks like::

    window: 7d                 # or  half_life: 3d
    admins: [root]
    policy:
      min_runtime_cap: {interactive: 8h, batch: 2d, debug: 1h}
    accounts:
      physics:                 # a program
        grant: 4000            # GPU-hours per window ...
        managers: [alice]
        children:
          lattice:
            grant: 2500
            members: [bob, carol]
            member_limits: {bob: {gpu_hours: 200, gpus: 4}}   # per member, optional
          astro:   {share: 30%, members: [dave]}      # ... or a percent of the parent
      biology:
        share: 40%
        children:
          genomics: {parent: biology, members: [erin]}   # `parent:` works for flat files too

Siblings' grants are their fair-share weights. ``member_limits`` caps one member's backed
work in a project: GPU-hours per window and GPUs running at once; past either, the member's
work still runs, unbacked. Every error names the path and line, and
nothing is loaded when there is one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from decimal import Decimal

from .members import MemberLimit, limit_problem, member_limits, valid_user_name
from .model import DAY, INTERCONNECTS, Policy
from .pricing import off_peak_from_node
from .yamlnodes import ConfigError, Node, parse

BudgetError = ConfigError

MAX_TREE_DEPTH = 32  # levels of programs and projects
MAX_GRANT_HOURS = 1e9  # the same bound the REST API puts on a grant
GRANT_DECIMALS = 3  # the finest step of a grant (GPU-hours, or a share's percent): 0.001


def grant_in_steps(v: float) -> bool:
    """Whether a grant figure is what an admin can mean: finite, not negative (nor -0.0),
    in steps of 0.001 (a subnormal such as 1e-320 or 12.0005 is refused, never rounded)."""
    if not math.isfinite(v) or v < 0 or math.copysign(1.0, v) < 0:
        return False
    exponent = Decimal(repr(float(v))).as_tuple().exponent
    return isinstance(exponent, int) and exponent >= -GRANT_DECIMALS
MAX_PENDING_PER_USER = 1_000_000  # policy.max_pending_per_user at most (0: no limit)

_TOP_KEYS = {"window", "half_life", "admins", "policy", "accounts"}
_ACCOUNT_KEYS = {"grant", "share", "members", "managers", "children", "parent", "description",
                 "member_limits"}
_POLICY_KEYS = {"min_runtime_cap", "default_runtime", "max_reservations", "backfill", "preemption",
                "placement", "preemption_margin", "checkpoint_interval", "restart_overhead",
                "whole_gpu_on_mig", "short_lane", "preemption_toll", "short_lane_cost",
                "short_lane_hold", "stop_grace", "mig_first", "mps_on_mig", "mps_mig_first",
                "short_lane_patience", "short_lane_late_cost", "gang_overdue_after",
                "gang_on_mig", "gang_on_mig_spare", "max_pending_per_user", "interconnect",
                "backfill_lease", "finish_drain_ratio",
                "finish_drain_budget", "managers_fund_own_projects", "manager_booking_limit",
                "reservation_idle_charge", "max_starts_per_cycle",
                "off_peak"}
_KIND_KEYS = {"interactive", "batch", "debug"}


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    parent: str | None
    grant_hours: float | None = None  # GPU-hours per window
    share_pct: float | None = None  # percent of the parent's (or the cluster's) grant
    members: frozenset[str] = frozenset()
    managers: frozenset[str] = frozenset()
    children: tuple[str, ...] = ()
    line: int = 0
    #: per member (sorted by name), their limits in this project
    member_limits: tuple[tuple[str, MemberLimit], ...] = ()


@dataclass(slots=True)
class AccountTree:
    """Programs and projects. Leaf accounts are projects: workloads charge them."""

    accounts: dict[str, Account]
    roots: tuple[str, ...]
    _paths: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in self.accounts:
            path: list[str] = []
            cur: str | None = name
            while cur is not None:
                path.append(cur)
                cur = self.accounts[cur].parent
            self._paths[name] = tuple(reversed(path))

    def get(self, name: str) -> Account:
        return self.accounts[name]

    def __contains__(self, name: object) -> bool:
        return name in self.accounts

    def is_project(self, name: str) -> bool:
        return name in self.accounts and not self.accounts[name].children

    def projects(self) -> list[str]:
        return [n for n, a in self.accounts.items() if not a.children]

    def path(self, name: str) -> tuple[str, ...]:
        """Account names from the root down to ``name``."""
        return self._paths[name]

    def projects_of(self, user: str) -> list[str]:
        """Leaf projects ``user`` may charge: membership of a project or of any ancestor."""
        return [p for p in self.projects()
                if any(user in self.accounts[a].members or user in self.accounts[a].managers
                       for a in self._paths[p])]

    def member_limit(self, project: str, user: str) -> MemberLimit | None:
        """``user``'s limits in ``project`` (None: none set)."""
        for name, lim in self.accounts[project].member_limits:
            if name == user:
                return lim
        return None

    def with_member_limit(self, project: str, user: str,
                          limit: MemberLimit | None) -> AccountTree:
        """A copy with ``user``'s limits in ``project`` set (None: cleared)."""
        acc = self.accounts[project]
        rest = {n: lim for n, lim in acc.member_limits if n != user}
        if limit is not None:
            rest[user] = limit
        accounts = dict(self.accounts)
        accounts[project] = replace(acc, member_limits=tuple(sorted(rest.items())))
        return AccountTree(accounts, self.roots)

    def can_manage(self, user: str, account: str) -> bool:
        return any(user in self.accounts[a].managers for a in self._paths[account])

    def effective_grants(self, cluster_gpu_hours: float) -> dict[str, float]:
        """GPU-hours per window for every account; percent shares resolve against the parent
        (or, at the top, against the cluster's capacity over the window)."""
        out: dict[str, float] = {}

        def walk(name: str, parent_grant: float) -> None:
            a = self.accounts[name]
            if a.grant_hours is not None:
                g = a.grant_hours
            elif a.share_pct is not None:
                g = parent_grant * a.share_pct / 100.0
            else:  # a grouping without a grant of its own: its children's grants added up
                g = sum(self.accounts[c].grant_hours or 0.0 for c in a.children)
            out[name] = g
            for c in a.children:
                walk(c, g)

        for r in self.roots:
            walk(r, cluster_gpu_hours)
        return out

    def charges_as_member(self, user: str, account: str) -> bool:
        """Whether ``user`` may charge a project at or below ``account`` through membership
        (``members:`` of that project or of an account above it) — managing alone does not
        count: a manager's own work is what a grant change must not fund unchecked."""
        return any(account in self._paths[p]
                   and any(user in self.accounts[a].members for a in self._paths[p])
                   for p in self.projects())

    def with_grant(self, name: str, grant_hours: float | None,
                   share_pct: float | None = None) -> AccountTree:
        """A copy with one account's grant changed (what-if, admin edits)."""
        accounts = dict(self.accounts)
        accounts[name] = replace(accounts[name], grant_hours=grant_hours, share_pct=share_pct)
        return AccountTree(accounts, self.roots)


def self_funded(before: AccountTree, after: AccountTree, user: str,
                cluster_gpu_hours: float) -> tuple[str, ...]:
    """The accounts whose grant a change from ``before`` to ``after`` raises and that ``user``
    charges through membership (:meth:`AccountTree.charges_as_member`), sorted: a change
    that funds its own maker. Empty when it funds nobody the user is a member of."""
    g0 = before.effective_grants(cluster_gpu_hours)
    g1 = after.effective_grants(cluster_gpu_hours)
    return tuple(sorted(a for a in after.accounts if g1[a] > g0.get(a, 0.0) + 1e-6
                        and after.charges_as_member(user, a)))


def grant_approvers(tree: AccountTree, account: str, admins: frozenset[str],
                    funded: tuple[str, ...]) -> tuple[str, ...]:
    """Who may make (and so approve) a change to ``account``'s grant that funds ``funded``:
    the budgets file's admins, and the managers of an account above ``account`` who are
    members of none of ``funded``, sorted."""
    managers = {m for a in tree.path(account)[:-1] for m in tree.get(a).managers}
    ok = {m for m in managers if not any(tree.charges_as_member(m, f) for f in funded)}
    return tuple(sorted(ok | set(admins)))


@dataclass(frozen=True, slots=True)
class Budgets:
    accounts: AccountTree
    policy: Policy
    admins: frozenset[str]


def load_budgets(text: str | bytes, source: str = "<budgets>") -> Budgets:
    """Parse and validate a budgets YAML document (text, or the file's bytes: UTF-8 is
    checked); raise :class:`BudgetError` on any problem."""
    root = parse(text, source)
    top = root.mapping(_TOP_KEYS)
    if "accounts" not in top:
        raise root.error("missing required key 'accounts'")

    policy = Policy()
    if "window" in top and "half_life" in top:
        raise top["half_life"].error("give either 'window' or 'half_life', not both")
    if "window" in top:
        w = top["window"].duration()
        if w <= 0:
            raise top["window"].error("the window must be longer than zero")
        policy = replace(policy, window=w)
    if "half_life" in top:
        h = top["half_life"].duration()
        if h <= 0:
            raise top["half_life"].error("the half-life must be longer than zero")
        policy = replace(policy, half_life=h, window=max(policy.window, 10 * h))
    if "policy" in top:
        policy = _load_policy(top["policy"], policy)
    admins = frozenset(top["admins"].string_list()) if "admins" in top else frozenset()

    raw: dict[str, tuple[Node, str | None]] = {}
    declared_parent: dict[str, Node] = {}
    accounts_node = top["accounts"]
    if not accounts_node.mapping():
        raise accounts_node.error("there must be at least one account")
    _collect(accounts_node, None, raw, declared_parent)

    # resolve `parent:` references (flat files) and detect cycles
    parent_of: dict[str, str | None] = {}
    for name, (_node, nested_parent) in raw.items():
        if name in declared_parent:
            pnode = declared_parent[name]
            p = pnode.string()
            if p not in raw:
                raise pnode.error(f"parent {p!r} is not a defined account")
            if nested_parent is not None and p != nested_parent:
                raise pnode.error(f"parent {p!r} contradicts the nesting under {nested_parent!r}")
            parent_of[name] = p
        else:
            parent_of[name] = nested_parent
    _check_tree(raw, parent_of, declared_parent)

    children: dict[str, list[str]] = {n: [] for n in raw}
    for name, par in parent_of.items():
        if par is not None:
            children[par].append(name)

    accounts: dict[str, Account] = {}
    for name, (node, _) in raw.items():
        fields = node.mapping()
        grant = share = None
        if "grant" in fields and "share" in fields:
            raise fields["share"].error("give either 'grant' (GPU-hours) or 'share' (percent), not both")
        if "grant" in fields:
            grant = fields["grant"].number(minimum=None, maximum=MAX_GRANT_HOURS)
            if grant < 0:
                raise fields["grant"].error(f"a grant cannot be negative, got {grant:g}")
            if not grant_in_steps(grant):
                raise fields["grant"].error(f"a grant is GPU-hours in steps of 0.001 (at most "
                                            f"{GRANT_DECIMALS} decimals), got {grant!r}")
        if "share" in fields:
            share = _percent(fields["share"])
        members = frozenset(fields["members"].string_list()) if "members" in fields else frozenset()
        managers = frozenset(fields["managers"].string_list()) if "managers" in fields else frozenset()
        limits = member_limits(fields["member_limits"], name, children[name]) \
            if "member_limits" in fields else ()
        accounts[name] = Account(name, parent_of[name], grant, share, members, managers,
                                 tuple(children[name]), node.line, limits)

    # siblings' percent shares may not exceed 100 %
    groups: dict[str | None, list[str]] = {}
    for name, a in accounts.items():
        groups.setdefault(a.parent, []).append(name)
    for parent, sibs in groups.items():
        total = sum(accounts[s].share_pct or 0.0 for s in sibs)
        if total > 100.0 + 1e-9:
            last = max((s for s in sibs if accounts[s].share_pct), key=lambda s: accounts[s].line)
            node = raw[last][0].mapping()["share"]
            where = f"children of {parent!r}" if parent else "top-level accounts"
            raise node.error(f"shares of the {where} add up to {total:g}% (over 100%)")

    roots = tuple(n for n, a in accounts.items() if a.parent is None)
    tree = AccountTree(accounts, roots)
    for name, a in accounts.items():  # a limit is for someone who may charge the project
        for user, _ in a.member_limits:
            if name not in tree.projects_of(user):
                node = raw[name][0].mapping()["member_limits"].mapping()[user]
                raise node.error(f"member_limits: {user!r} is not a member of {name!r}")
    return Budgets(tree, policy, admins)


def _check_tree(raw: dict[str, tuple[Node, str | None]], parent_of: dict[str, str | None],
                declared_parent: dict[str, Node]) -> None:
    """Refuse cycles and trees deeper than MAX_TREE_DEPTH; each account is walked once
    (linear in the number of accounts, whatever the shape)."""
    depth: dict[str, int] = {}
    for name in raw:
        chain: list[str] = []
        on_chain: set[str] = set()
        cur: str | None = name
        while cur is not None and cur not in depth:
            if cur in on_chain:
                cycle = " -> ".join([*chain[chain.index(cur):], cur])
                node = declared_parent.get(cur, raw[cur][0])
                raise node.error(f"accounts form a cycle: {cycle}")
            chain.append(cur)
            on_chain.add(cur)
            cur = parent_of[cur]
        base = depth[cur] if cur is not None else 0
        for i, a in enumerate(reversed(chain)):
            depth[a] = base + i + 1
            if depth[a] > MAX_TREE_DEPTH:
                node = declared_parent.get(a, raw[a][0])
                raise node.error(f"the account tree is deeper than {MAX_TREE_DEPTH} levels "
                                 f"at {a!r}")


def _collect(mapping_node: Node, parent: str | None, raw: dict[str, tuple[Node, str | None]],
             declared_parent: dict[str, Node]) -> None:
    for name, node in mapping_node.mapping().items():
        if not _valid_name(name):
            raise node.error(f"account name {name!r} must be letters, digits, '-', '_' or '.'")
        if name in raw:
            first = raw[name][0]
            raise node.error(f"duplicate account name {name!r} (also defined at line {first.line})")
        fields = node.mapping(_ACCOUNT_KEYS)
        raw[name] = (node, parent)
        if "parent" in fields:
            declared_parent[name] = fields["parent"]
        if "children" in fields:
            kids = fields["children"]
            if not isinstance(kids.value, dict):
                raise kids.error("expected a mapping of child accounts")
            _collect(kids, name, raw, declared_parent)


def _valid_name(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "-_." for c in name)


def _percent(node: Node) -> float:
    v = node.value
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            pct = float(v.strip()[:-1])
        except ValueError:
            raise node.error(f"expected a percent such as '30%', got {v!r}") from None
    elif isinstance(v, int | float) and not isinstance(v, bool):
        pct = float(v)
    else:
        raise node.error(f"expected a percent such as '30%', got {v!r}")
    if not 0.0 <= pct <= 100.0:
        raise node.error(f"a share must be between 0% and 100%, got {pct:g}%")
    return pct


def _load_policy(node: Node, policy: Policy) -> Policy:
    fields = node.mapping(_POLICY_KEYS)
    if "min_runtime_cap" in fields:
        caps = dict(policy.min_runtime_cap)
        for kind, v in fields["min_runtime_cap"].mapping(_KIND_KEYS).items():
            caps[kind] = v.duration()
        policy = replace(policy, min_runtime_cap=tuple(sorted(caps.items())))
    if "interconnect" in fields:
        levels = dict(policy.interconnect)
        for kind, v in fields["interconnect"].mapping(_KIND_KEYS).items():
            level = v.string()
            if level not in INTERCONNECTS:
                raise v.error(f"interconnect: expected one of {', '.join(INTERCONNECTS)}, "
                              f"got {level!r}")
            levels[kind] = level
        policy = replace(policy, interconnect=tuple(sorted(levels.items())))
    if "default_runtime" in fields:
        d = fields["default_runtime"].duration()
        if d <= 0:
            raise fields["default_runtime"].error("must be longer than zero")
        policy = replace(policy, default_runtime=d)
    if "max_reservations" in fields:
        policy = replace(policy, max_reservations=int(
            fields["max_reservations"].number(minimum=0, integer=True)))
    if "max_starts_per_cycle" in fields:
        policy = replace(policy, max_starts_per_cycle=int(
            fields["max_starts_per_cycle"].number(minimum=0, integer=True)))
    if "backfill" in fields:
        policy = replace(policy, backfill=fields["backfill"].boolean())
    if "preemption" in fields:
        policy = replace(policy, preemption=fields["preemption"].boolean())
    if "preemption_margin" in fields:
        policy = replace(policy, preemption_margin=fields["preemption_margin"].number(minimum=0))
    if "checkpoint_interval" in fields:
        policy = replace(policy, checkpoint_interval=fields["checkpoint_interval"].duration())
    if "restart_overhead" in fields:
        policy = replace(policy, restart_overhead=fields["restart_overhead"].duration())
    if "preemption_toll" in fields:
        policy = replace(policy, preemption_toll=fields["preemption_toll"].number(minimum=0))
    if "short_lane_cost" in fields:
        policy = replace(policy, short_lane_cost=fields["short_lane_cost"].number(minimum=0))
    if "short_lane_hold" in fields:
        policy = replace(policy, short_lane_hold=int(
            fields["short_lane_hold"].number(minimum=0, integer=True)))
    if "short_lane" in fields:
        policy = replace(policy, short_lane=fields["short_lane"].duration())
    if "whole_gpu_on_mig" in fields:
        policy = replace(policy, whole_gpu_on_mig=fields["whole_gpu_on_mig"].boolean())
    if "mig_first" in fields:
        policy = replace(policy, mig_first=fields["mig_first"].boolean())
    if "mps_on_mig" in fields:
        policy = replace(policy, mps_on_mig=fields["mps_on_mig"].boolean())
    if "mps_mig_first" in fields:
        policy = replace(policy, mps_mig_first=fields["mps_mig_first"].boolean())
    if "gang_on_mig" in fields:
        policy = replace(policy, gang_on_mig=fields["gang_on_mig"].boolean())
    if "gang_on_mig_spare" in fields:
        policy = replace(policy, gang_on_mig_spare=int(
            fields["gang_on_mig_spare"].number(minimum=0, integer=True)))
    if "max_pending_per_user" in fields:
        policy = replace(policy, max_pending_per_user=int(
            fields["max_pending_per_user"].number(minimum=0, integer=True,
                                                   maximum=MAX_PENDING_PER_USER)))
    if "manager_booking_limit" in fields:
        policy = replace(policy, manager_booking_limit=int(
            fields["manager_booking_limit"].number(minimum=0, integer=True, maximum=100_000)))
    if "reservation_idle_charge" in fields:
        policy = replace(policy, reservation_idle_charge=fields[
            "reservation_idle_charge"].number(minimum=0, maximum=1))
    if "short_lane_patience" in fields:
        policy = replace(policy, short_lane_patience=fields["short_lane_patience"].duration())
    if "short_lane_late_cost" in fields:
        policy = replace(policy, short_lane_late_cost=fields["short_lane_late_cost"].number(
            minimum=0))
    if "gang_overdue_after" in fields:
        policy = replace(policy, gang_overdue_after=fields["gang_overdue_after"].duration())
    if "backfill_lease" in fields:
        policy = replace(policy, backfill_lease=fields["backfill_lease"].duration())
    if "finish_drain_ratio" in fields:
        policy = replace(policy, finish_drain_ratio=fields["finish_drain_ratio"].number(
            minimum=0))
    if "finish_drain_budget" in fields:
        policy = replace(policy, finish_drain_budget=fields["finish_drain_budget"].number(
            minimum=0, maximum=1))
    if "managers_fund_own_projects" in fields:
        policy = replace(policy, managers_fund_own_projects=fields[
            "managers_fund_own_projects"].boolean())
    if "stop_grace" in fields:  # a preempted session's grace period (its snapshot's time)
        policy = replace(policy, stop_grace=fields["stop_grace"].duration())
    if "off_peak" in fields:
        policy = replace(policy, off_peak=off_peak_from_node(fields["off_peak"]))
    if "placement" in fields:
        how = fields["placement"].string()
        if how not in ("fgd", "pack"):
            raise fields["placement"].error(f"placement must be 'fgd' or 'pack', got {how!r}")
        policy = replace(policy, placement=how)
    return policy


__all__ = ["Account", "AccountTree", "Budgets", "BudgetError", "load_budgets", "DAY",
           "MemberLimit", "grant_approvers", "limit_problem", "self_funded", "valid_user_name"]
