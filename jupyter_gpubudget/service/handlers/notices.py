"""My notice delivery settings: where notices go besides JupyterLab (a webhook, e-mail).

``GET /notices/settings``: my preference and my latest failed deliveries.
``PUT /notices/settings``: ``{"webhook": "https://…" | null, "email": "me@…" | null}``;
a bad field is a 400 naming it and changes nothing; both null removes the preference.
``DELETE /notices/settings``: remove it. ``service/delivery.py`` sends the notices.
"""

from __future__ import annotations

from ..auth import SCOPE_READ, SCOPE_SUBMIT, needs_scope
from ..base import ApiError, BaseHandler
from ..delivery import NoticeDelivery, check_pref, failures_of, get_pref, pref_json, set_pref


class NoticeSettingsHandler(BaseHandler):
    async def _reply(self, user: str) -> None:
        ledger = self.svc.ledger
        row = await self.db(get_pref, ledger, user)
        out = pref_json(row, user)
        out["failures"] = await self.db(failures_of, ledger, user)
        out["email_available"] = bool(NoticeDelivery(parent=self.svc).smtp_host)
        self.send(out)

    @needs_scope(SCOPE_READ)
    async def get(self) -> None:
        c = await self.caller()
        await self._reply(c.name)

    @needs_scope(SCOPE_SUBMIT)
    async def put(self) -> None:
        c = await self.caller()
        pref = check_pref(self.body())
        delivery = NoticeDelivery(parent=self.svc)
        if pref["webhook"]:
            delivery.check_webhook_host(pref["webhook"])
        if pref["email"] and not delivery.smtp_host:
            raise ApiError(400, "email: this site has no SMTP relay configured; use a webhook",
                           "email")
        await self.db(set_pref, self.svc.ledger, c.name, pref["webhook"], pref["email"],
                      self.svc.clock())
        await self._reply(c.name)

    @needs_scope(SCOPE_SUBMIT)
    async def delete(self) -> None:
        c = await self.caller()
        await self.db(set_pref, self.svc.ledger, c.name, None, None, self.svc.clock())
        await self._reply(c.name)


API_ROUTES = [
    ("/notices/settings", NoticeSettingsHandler),
]
