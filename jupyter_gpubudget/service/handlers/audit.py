"""``GET /audit``: the audit trail for admins and managers (``service/audit.py``), as JSON or,
with ``?format=csv``, as a CSV download. The Audit page (``pages.py``) shows the same."""

from __future__ import annotations

import time

from ..audit import CSV_MAX, BadFilter, audit_csv, audit_overview, audit_scope, parse_filters
from ..base import ApiError
from ..validate import MAX_DB_INT, query_int
from .operator import OperatorHandler


class AuditHandler(OperatorHandler):
    async def get(self) -> None:
        c = await self.caller()
        scope = audit_scope(c, self.tree)  # 403 before any filter is looked at
        tz = self.tz()
        q = self.get_query_argument
        fmt = q("format", None) or "json"
        if fmt not in ("json", "csv"):
            raise ApiError(400, f"format: expected json or csv, got {fmt[:20]!r}", "format")
        try:
            f = parse_filters(lambda k: q(k, None), self.tree, scope, tz)
        except BadFilter as e:
            raise ApiError(400, e.message, e.field) from None
        before = query_int(q("before", None), "before", 0, MAX_DB_INT)
        limit = (CSV_MAX if fmt == "csv" else
                 query_int(q("limit", None), "limit", 1, 1000, default=100))
        assert limit is not None
        out = await self.db(lambda: audit_overview(self.svc, c, scope, f, self.svc.clock(), tz,
                                                   before, limit))
        if fmt == "json":
            self.send(out)
            return
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        stamp = time.strftime("%Y%m%d-%H%M")
        self.set_header("Content-Disposition",
                        f'attachment; filename="gpubudget-audit-{stamp}.csv"')
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(audit_csv(out["entries"]))


API_ROUTES = [("/audit", AuditHandler)]
