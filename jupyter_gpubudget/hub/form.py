"""The spawn form: the user's projects with their budget, the cluster (where the service
schedules several: a named one, or wherever the session starts soonest), the slices the
inventory offers (grouped, with memory and compute), the minimum runtime (presets, a custom
value, the cap) and a live quote for exactly what is selected.

Rendered from a Jinja template (``BudgetSpawner.form_template``; default
``templates/gpubudget_form.html`` in this package) with the context built by
:func:`form_context` from the service's offer (``GET /sessions/offer``). An admin's template
may ``{% extends "gpubudget_form.html" %}`` and override its blocks. The live quote is fetched
by the page from the hub (``handlers.QuoteHandler``), one quote per request.
"""

from __future__ import annotations

import json
import logging
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tornado import web

from jupyter_gpubudget.service.validate import Invalid, duration

from .client import ServiceError
from .words import gpu_hours, span, standing_words, when

if TYPE_CHECKING:
    from .spawner import BudgetSpawner

TEMPLATES = Path(__file__).parent / "templates"
DEFAULT_TEMPLATE = "gpubudget_form.html"

class ChoiceRefused(web.HTTPError):
    """A spawn-form choice the spawner refuses (400, or 403 for another's project): the form
    comes back with ``message`` and the hub's log gets one line (:class:`OneLineRefusals`).
    The message is never a %-format (a user's text in it is passed as an argument)."""

    def __init__(self, status: int, message: str, user: str = "") -> None:
        super().__init__(status, "%s", message)
        self.message, self.user = message, user


class OneLineRefusals(logging.Filter):
    """JupyterHub logs whatever ``options_from_form`` raises as an error with its traceback
    (``SpawnHandler._post``: "Failed to spawn single-user server with form", ``exc_info``),
    so a user posting bad choices could fill the hub's log. For a :class:`ChoiceRefused`
    this filter makes that record one warning line saying who was refused and why (line
    breaks in the user's text escaped); every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, ChoiceRefused):
            text = f"{record.getMessage()}: {exc.status_code} for {exc.user or 'a user'}: " \
                   f"{exc.message}"
            record.msg, record.args = "%s", (text.replace("\r", "\\r").replace("\n", "\\n"),)
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def refuse_in_one_line(log: logging.Logger | logging.LoggerAdapter) -> None:
    """Put :class:`OneLineRefusals` on ``log`` (the hub's own logger, which its handlers
    share with the spawner) once."""
    logger = log.logger if isinstance(log, logging.LoggerAdapter) else log
    if not any(isinstance(f, OneLineRefusals) for f in logger.filters):
        logger.addFilter(OneLineRefusals())


#: slice groups in the order the form shows them: kind -> (title, what it means)
GROUPS = (
    ("cpu", "CPU only", "no GPU: for editing, data preparation, small tests"),
    ("mig", "MIG slices", "a fixed part of one GPU with its own memory and compute: nobody "
                          "else's work can slow it down"),
    ("mps", "MPS shares", "a share of one GPU's compute; its memory is shared with the "
                          "other sessions on that GPU"),
    ("gpu", "Whole GPUs", "one or more complete GPUs"),
)
EXPLAIN = ("<b>Protected</b>: for the minimum runtime you choose, nobody can take the slice "
           "from you. <b>Backed</b>: your project's grant covers that protected time; an "
           "unbacked session may still run on idle GPUs, but it is never protected and is "
           "stopped first when backed work needs the slice.")


@cache
def _environment(extra_dir: str) -> Any:
    from jinja2 import ChoiceLoader, Environment, FileSystemLoader, select_autoescape

    loaders = ([FileSystemLoader(extra_dir)] if extra_dir else []) + [FileSystemLoader(TEMPLATES)]
    return Environment(loader=ChoiceLoader(loaders), autoescape=select_autoescape(default=True),
                       trim_blocks=True, lstrip_blocks=True)


def render_template(template: str, context: dict) -> str:
    """``template``: a file path (an admin's template; it may extend ``gpubudget_form.html``)
    or empty for the package's default."""
    if template:
        p = Path(template)
        return _environment(str(p.parent.resolve())).get_template(p.name).render(**context)
    return _environment("").get_template(DEFAULT_TEMPLATE).render(**context)


async def render_form(spawner: BudgetSpawner) -> str:
    """``BudgetSpawner.options_form``: the form for this user, keeping the choices of the
    last attempt (after an error the form comes back as the user left it)."""
    chosen = spawner.form_choices()
    ctx: dict[str, Any]
    try:
        offer = await spawner.offer(quotes=False)
    except ServiceError as e:
        ctx = {"error": f"The GPU budget service is not answering ({e.message}). Reload this "
                        "page in a moment.", "hide_start": True}
        return render_template(spawner.form_template, ctx)
    ctx = form_context(offer, chosen, spawner.min_runtime_presets, spawner.default_min_runtime)
    if ctx["projects"]:
        try:
            ctx["quote"] = await spawner.quote(ctx["selected"]["project"],
                                               ctx["selected"]["slice"],
                                               ctx["selected"]["min_runtime"],
                                               ctx["selected"]["cluster"])
        except ServiceError as e:
            ctx["quote_error"] = e.message
    ctx.update(quote_url=spawner.quote_url(), server_name=spawner.name or "",
               user_name=spawner.user.name)
    ctx["quote_json"] = json.dumps(ctx.get("quote"))
    ctx["quote_text"] = quote_words(ctx.get("quote"))
    return render_template(spawner.form_template, ctx)


def _runtime_presets(presets: list[str], cap: float, default: str) -> list[dict]:
    out: list[dict] = []
    for p in [*presets, default]:
        try:
            secs = duration(p, "min_runtime")
        except Invalid:
            continue
        if secs <= cap and all(o["seconds"] != secs for o in out):
            out.append({"value": p, "seconds": secs, "label": span(secs)})
    out.sort(key=lambda o: o["seconds"])
    return out


def form_context(offer: dict, chosen: dict, presets: list[str], default_min_runtime: str
                 ) -> dict:
    """What the template needs, from the service's offer and the user's last choices."""
    projects = offer.get("projects") or []
    figures = offer.get("figures") or {}
    cap = float(offer.get("min_runtime_cap") or 0)
    inv = offer.get("inventory")
    window = float(offer.get("window_s") or 7 * 86400)
    ctx: dict[str, Any] = {
        "explain": EXPLAIN, "now": offer.get("now") or time.time(),
        "inventory": inv, "inventory_gpus": offer.get("inventory_gpus", 0),
        "inventory_text": ("GPUs discovered with NVML" if inv == "nvml" else
                           "a declared inventory (no GPU driver here: demo or test hardware)"),
        "cap_s": cap, "cap_text": span(cap), "hide_start": not projects,
        "window_text": span(window),
    }
    ctx["projects"] = []
    for p in projects:
        f = figures.get(p) or {}
        grant, used, left = f.get("grant_hours"), f.get("usage_hours"), f.get("left_hours")
        st = f.get("standing")
        where = f"{f['parent']} › {p}" if f.get("parent") else p
        if grant is None:
            short = f"{p} — {standing_words(st, short=True)}"
            info = f"{where}: {standing_words(st)}."
        else:
            short = (f"{p} — {gpu_hours(max(0.0, left or 0.0))[:-6]} of {gpu_hours(grant)} left · "
                     f"{standing_words(st, short=True)}")
            info = (f"{where}: granted {gpu_hours(grant)} per {span(window)}, used "
                    f"{gpu_hours(used or 0.0)}, {gpu_hours(max(0.0, left or 0.0))} left. "
                    f"Standing {st if st is not None else 0:.2f} (used ÷ grant): "
                    f"{standing_words(st)}.")
        ctx["projects"].append({
            "name": p, "parent": f.get("parent"), "grant_hours": grant, "usage_hours": used,
            "left_hours": left, "standing": st, "standing_words": standing_words(st),
            "option_text": short, "info": info})
    choices = offer.get("choices") or []
    ctx["groups"] = []
    for kind, title, what in GROUPS:
        items = [dict(ch, hint=slice_hint(ch), short=slice_name(ch)) for ch in choices
                 if ch.get("kind") == kind]
        if items:
            ctx["groups"].append({"kind": kind, "title": title, "what": what,
                                  "choices": items})
    keys = [ch["key"] for ch in choices]
    default_slice = next((ch["key"] for kind in ("mig", "mps", "gpu") for ch in choices
                          if ch.get("kind") == kind), keys[0] if keys else "cpu")
    project = chosen.get("project") if chosen.get("project") in projects else (
        projects[0] if projects else "")
    sl = chosen.get("slice") if chosen.get("slice") in keys else default_slice
    clusters = [c for c in offer.get("clusters") or [] if isinstance(c, dict) and c.get("name")]
    ctx["clusters"] = [dict(c, hint=cluster_hint(c)) for c in clusters] if len(clusters) > 1 \
        else []
    names = [c["name"] for c in ctx["clusters"]]
    cluster = chosen.get("cluster") if chosen.get("cluster") in names else ""
    ctx["presets"] = _runtime_presets(presets, cap, default_min_runtime)
    mr = str(chosen.get("min_runtime") or default_min_runtime)
    ctx["custom_runtime"] = all(o["value"] != mr for o in ctx["presets"])
    ctx["selected"] = {"project": project, "slice": sl, "min_runtime": mr, "cluster": cluster}
    ctx["bookings"] = booking_choices(offer, keys)
    return ctx


def booking_choices(offer: dict, keys: list[str]) -> list[dict]:
    """The bookings of the user's projects the form offers to start "in reservation X": each
    with whether its window is open now and the whole-GPU slice it fits (``gpu:N``, the
    largest offered up to its GPUs)."""
    now = float(offer.get("now") or time.time())
    out = []
    for b in offer.get("bookings") or []:
        if not isinstance(b, dict) or b.get("state") not in ("booked", "active"):
            continue
        n = next((k for k in (f"gpu:{i}" for i in range(int(b.get("gpus") or 0), 0, -1))
                  if k in keys), "")
        out.append(dict(b, open=float(b["start"]) <= now < float(b["end"]), slice=n))
    return out


def in_booking(opts: dict, booking_id: str, offer: dict | None, now: float, who: str) -> dict:
    """``opts`` for a session started "in reservation ``booking_id``": charged to the
    booking's project. Refused (400) when it is not one of the user's bookings or its window
    is not open now."""
    found = next((b for b in (offer or {}).get("bookings") or []
                  if isinstance(b, dict) and b.get("id") == booking_id), None)
    if found is None:
        raise ChoiceRefused(400, f"Reservation: {booking_id[:40]!r} is not a reservation of "
                                 "your projects.", who)
    if not float(found["start"]) <= now < float(found["end"]):
        raise ChoiceRefused(400, f"Reservation {booking_id}: its window is not open now; "
                                 "start the session inside it.", who)
    return dict(opts, project=found["project"])


def cluster_hint(c: dict) -> str:
    """'8 GPUs (H100-80GB) on 2 nodes'."""
    gpus, nodes = int(c.get("gpus") or 0), int(c.get("nodes") or 0)
    models = ", ".join(str(m) for m in c.get("models") or [])
    return (f"{gpus} GPU{'s' if gpus != 1 else ''}" + (f" ({models})" if models else "") +
            f" on {nodes} node{'s' if nodes != 1 else ''}")


def slice_name(ch: dict) -> str:
    """'MIG 3g.40gb', 'MPS share, 25%', '2 whole GPUs', 'CPU only'."""
    key, kind = str(ch.get("key", "")), ch.get("kind")
    if kind == "mig":
        return f"MIG {key[4:]}"
    if kind == "mps":
        return f"MPS share, {float(ch.get('fraction') or 0) * 100:g}%"
    if kind == "cpu":
        return "CPU only"
    return str(ch.get("label") or key)


def slice_hint(ch: dict) -> str:
    """'40 GB memory · 3/7 of an H100-80GB · 0.43 GPU-h per hour'."""
    kind, frac = ch.get("kind"), float(ch.get("fraction") or 0)
    if kind == "cpu":
        return "no GPU · costs no GPU-hours"
    parts = []
    if kind == "mig":
        model = ch.get("gpu_model") or "GPU"
        article = "an" if model[:1].upper() in "AEFHILMNORSX" else "a"
        parts += [f"{ch.get('memory_gb')} GB memory",
                  f"{round(frac * 7)}/7 of {article} {model}"]
    elif kind == "mps":
        parts.append(f"{frac * 100:g}% of a GPU's compute")
        if ch.get("gpu_memory_gb"):
            parts.append(f"its {ch['gpu_memory_gb']} GB memory shared")
    elif ch.get("memory_gb"):
        parts.append(f"{ch['memory_gb']} GB memory")
    parts.append(f"{gpu_hours(frac)} per hour")
    return " · ".join(parts)


def quote_words(answer: dict | None) -> str:
    """The quote in words (hub's local time), for browsers without JavaScript."""
    if not answer:
        return ""
    q = answer.get("quote") or {}
    start = "starts now" if q.get("starts_now") else \
        f"predicted start {when(q.get('predicted_start'), answer.get('now'))}"
    if q.get("cluster"):
        start += f" on cluster {q['cluster']}"
    price = f" Off-peak prices: {q['price']['text']}." if q.get("price") else ""
    if q.get("backed"):
        return (f"{answer.get('project')}: {start}; protected for "
                f"{span(q.get('protected_s') or 0)}, which costs "
                f"{gpu_hours(q.get('cost_gpu_hours') or 0)}; backed.{price}")
    return (f"{answer.get('project')}: {start}; unbacked: never protected, stopped first "
            f"when backed work needs the slice.{price}")
