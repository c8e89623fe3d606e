"""The spawn form: the user's projects, slices with quotes, minimum runtime, the inventory in
use. Rendered from the service's offer (``GET /sessions/offer``)."""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from .client import ServiceError
from .words import hours as _hours
from .words import when as _when

if TYPE_CHECKING:
    from .spawner import BudgetSpawner


async def render_form(spawner: BudgetSpawner) -> str:
    try:
        offer = await spawner.offer(spawner.default_min_runtime)
    except ServiceError as e:
        return (f"<div class='alert alert-danger'>The GPU budget service is not answering "
                f"({html.escape(e.message)}). Try again in a moment.</div>")
    return render_form_html(offer, spawner.default_min_runtime)


def render_form_html(offer: dict, min_runtime: str) -> str:
    e = html.escape
    projects = offer.get("projects") or []
    if not projects:
        return ("<div class='alert alert-warning'>You are not a member of any project, so no "
                "session can be charged. Ask an admin to add you to a project in the budgets "
                "file.</div>")
    inv = offer.get("inventory")
    inv_text = ("GPUs discovered with NVML" if inv == "nvml" else
                "a <b>declared</b> inventory (no GPU driver here: demo / test hardware)")
    cap = offer.get("min_runtime_cap") or 0
    now = offer.get("now") or time.time()
    out = [f"<p class='gpubudget-inventory'>Inventory in use: {inv_text}, "
           f"{offer.get('inventory_gpus', 0)} GPUs.</p>",
           "<div class='form-group'><label for='gpubudget-project'>Project (charged for the "
           "session)</label><select class='form-control' id='gpubudget-project' "
           "name='project'>"]
    for i, p in enumerate(projects):
        out.append(f"<option value='{e(p)}'{' selected' if i == 0 else ''}>{e(p)}</option>")
    out.append("</select></div>")
    out.append(f"<div class='form-group'><label for='gpubudget-min-runtime'>Minimum runtime "
               f"(protected time; at most {_hours(cap)})</label><input class='form-control' "
               f"id='gpubudget-min-runtime' name='min_runtime' value='{e(min_runtime)}'></div>")
    out.append("<fieldset class='form-group'><legend>Slice</legend>")
    for i, ch in enumerate(offer.get("choices") or []):
        key = ch["key"]
        out.append(f"<div class='gpubudget-choice'><label><input type='radio' name='slice' "
                   f"value='{e(key)}'{' checked' if i == 0 else ''}> {e(ch['label'])}</label>"
                   "<ul class='gpubudget-quotes'>")
        for p in projects:
            q = (offer.get("quotes") or {}).get(p, {}).get(key)
            if not q:
                continue
            backed = "backed" if q.get("backed") else "unbacked (never protected, preempted first)"
            out.append(f"<li data-project='{e(p)}'>{e(p)}: starts "
                       f"{e(_when(q.get('predicted_start'), now))}; protected "
                       f"{_hours(q.get('protected_s') or 0)}; cost "
                       f"{q.get('cost_gpu_hours', 0):.2f} GPU-h; {backed}</li>")
        out.append("</ul></div>")
    out.append("</fieldset>")
    return "\n".join(out)
