// The gpubudget service's pages: local times, the grant editor with its preview, and the
// admin's actions (drain/undrain a node, cancel/requeue work). Every change goes through the
// REST API with JupyterHub's XSRF token (the _xsrf cookie, sent as X-XSRFToken). A dialog
// closes as soon as its change is accepted and the page's content (#gb-page) is refreshed in
// place — no reload — once now and again after the scheduler's next cycles (standings, a node
// found empty); a refused change stays in the dialog with the service's reason.
"use strict";

(function () {
  const boot = JSON.parse(document.getElementById("gb-data").textContent);
  const api = boot.api;
  const tz = Intl.DateTimeFormat().resolvedOptions().timeZone;

  // ------------------------------------------------------------------ times
  function duration(s) {
    s = Math.abs(s);
    if (s < 60) return `${Math.round(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 86400) {
      const m = Math.round(s / 60);
      const h = Math.floor(m / 60), r = m % 60;
      return r ? `${h} h ${r} min` : `${h} h`;
    }
    const hrs = Math.round(s / 3600);
    const d = Math.floor(hrs / 24), r = hrs % 24;
    return r ? `${d} d ${r} h` : `${d} d`;
  }
  function relative(t, now) {
    const d = t - now;
    if (Math.abs(d) < 1) return "now";
    return d > 0 ? `in ${duration(d)}` : `${duration(d)} ago`;
  }
  // one way to write a time on every page (the hub's pages, these, the lab's sidebar): local,
  // 24-hour, "14:05" today, "Tue 14:05" within six days, else "3 Nov 14:05" (with the year
  // when not this one); the zone is said once, below the page (#gb-zone)
  const clockFmt = new Intl.DateTimeFormat("en-GB", {
    year: "numeric", month: "short", day: "numeric", weekday: "short",
    hour: "2-digit", minute: "2-digit", hourCycle: "h23",
  });
  function parts(ms) {
    return Object.fromEntries(clockFmt.formatToParts(new Date(ms)).map((p) => [p.type, p.value]));
  }
  function clock(t, now) {
    const d = parts(t * 1000), n = parts(now * 1000), hm = `${d.hour}:${d.minute}`;
    if (d.year === n.year && d.month === n.month && d.day === n.day) return hm;
    if (Math.abs(t - now) < 6 * 86400) return `${d.weekday} ${hm}`;
    return `${d.day} ${d.month}${d.year !== n.year ? ` ${d.year}` : ""} ${hm}`;
  }
  function zoneText() {
    const off = -new Date().getTimezoneOffset(), a = Math.abs(off);
    const utc = `UTC${off < 0 ? "-" : "+"}${String(Math.floor(a / 60)).padStart(2, "0")}:${String(a % 60).padStart(2, "0")}`;
    return tz && tz !== "UTC" && tz !== "Etc/UTC" ? `${tz} (${utc})` : "UTC";
  }
  for (const el of document.querySelectorAll(".gb-zone")) el.textContent = `Times are local: ${zoneText()}`;
  function renderTimes() {
    const now = Date.now() / 1000;
    for (const el of document.querySelectorAll("time[data-t]")) {
      const t = parseFloat(el.dataset.t);
      if (!t) continue;
      el.textContent = el.dataset.style === "ago"
        ? `${relative(t, now)} (${clock(t, now)})`
        : `${clock(t, now)} (${relative(t, now)})`;
      el.setAttribute("datetime", new Date(t * 1000).toISOString());
      el.title = `${clock(t, now)} ${zoneText()}`;
    }
  }
  renderTimes();
  setInterval(renderTimes, 20000);

  // ------------------------------------------------------------------ the API
  function xsrf() {
    const c = document.cookie.split("; ").find((x) => x.startsWith("_xsrf="));
    return c ? decodeURIComponent(c.slice(6)) : "";
  }
  // JupyterHub sets a fresh XSRF token (the _xsrf cookie) only on a page view: a page kept
  // open across a browser restart (or a new login in another tab) holds a stale one, and its
  // changes are refused as if logged out. A page view of the service in a hidden frame renews
  // it while the login is valid (a fetch cannot); the service answers it with an empty page.
  function renewXsrf() {
    return new Promise((done) => {
      const f = document.createElement("iframe");
      f.hidden = true;
      f.setAttribute("aria-hidden", "true");
      const end = () => { clearTimeout(timer); f.remove(); done(); };
      const timer = setTimeout(end, 15000);
      f.addEventListener("load", end);
      f.src = `${boot.prefix}?gb-renew-xsrf=1`;
      document.body.appendChild(f);
    });
  }
  const loggedOut = /missing, invalid or expired token/;
  // before a change: a stale token is found with a read (a refused write may have its
  // connection closed before its answer, which then reads as the service being down)
  async function freshXsrf() {
    const r = await fetch(`${api}/workloads/me/ended?limit=1`, {
      headers: { "X-XSRFToken": xsrf() }, credentials: "same-origin", cache: "no-store",
    }).catch(() => null);
    if (r && r.status === 403) await renewXsrf();
  }
  // A request the proxy lost on its way to the service (configurable-http-proxy answers 502,
  // 503 or 504 with the hub's HTML error page, not the service's JSON; or the fetch itself
  // fails) is sent once more when repeating it cannot do anything twice: a read, or a PUT,
  // which sets a state. A POST is never sent again.
  const REPEATABLE = new Set(["GET", "PUT"]);
  async function send(method, url, init) {
    for (let attempt = 0; ; attempt++) {
      const last = attempt > 0 || !REPEATABLE.has(method);
      let r;
      try {
        r = await fetch(url, init);
      } catch (e) {
        if (last) throw new Error("The service could not be reached; check your connection and try again.");
        r = null;
      }
      const lost = r === null || ([502, 503, 504].includes(r.status)
        && !(r.headers.get("Content-Type") || "").startsWith("application/json"));
      if (!lost || last) return r;
      await new Promise((ok) => setTimeout(ok, 500));
    }
  }
  async function call(method, path, body, renewed = false) {
    if (method !== "GET" && !renewed) await freshXsrf();
    const sep = path.includes("?") ? "&" : "?";
    const r = await send(method, `${api}${path}${sep}tz=${encodeURIComponent(tz)}`, {
      method,
      headers: { "Content-Type": "application/json", "X-XSRFToken": xsrf() },
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
    });
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      let msg = (data && data.message) || `${r.status} ${r.statusText}`;
      if (r.status === 403 && loggedOut.test(msg)) {
        if (!renewed) {  // a stale token: renew it and try once more
          await renewXsrf();
          return call(method, path, body, true);
        }
        msg = "Not done: you are no longer logged in (you logged out, or your login expired). Reload the page to log in again, then repeat this change.";
      }
      throw new Error(msg);
    }
    return data;
  }
  // after a change: wait until a scheduling cycle that started after it has finished, so the
  // reloaded page shows its effect
  async function afterNextCycle() {
    const first = await call("GET", "/healthz").catch(() => null);
    const start = first ? first.cycle : 0;
    const until = Date.now() + 15000;
    while (Date.now() < until) {
      await new Promise((ok) => setTimeout(ok, 300));
      const h = await call("GET", "/healthz").catch(() => null);
      if (h && h.cycle >= start + 2) return;
    }
  }
  function show(el, text) {
    el.textContent = text;
    el.classList.remove("d-none");
  }
  function flash(text, kind = "success") {
    const a = document.getElementById("gb-alert");
    a.className = `alert alert-${kind}`;
    a.textContent = text;
  }
  // Bootstrap ignores hide() while a dialog is still fading in, so a change accepted within
  // that fade (a quick click, a fast service) left its dialog open: close it once it is shown
  function closer(el, modal) {
    let shown = false, pending = false;
    el.addEventListener("show.bs.modal", () => { shown = false; pending = false; });
    el.addEventListener("shown.bs.modal", () => {
      shown = true;
      if (pending) { pending = false; modal.hide(); }
    });
    el.addEventListener("hidden.bs.modal", () => { shown = false; pending = false; });
    return () => { if (shown) modal.hide(); else pending = true; };
  }
  // the page's content as the service renders it now, swapped in place (open history rows
  // stay open); the buttons in it work through the listeners on document below
  async function refresh() {
    // (a fetch is not a navigation: JupyterHub accepts the login cookie only with its XSRF token)
    const r = await fetch(location.href, {
      headers: { Accept: "text/html", "X-XSRFToken": xsrf() }, credentials: "same-origin",
      cache: "no-store", redirect: "error",
    });
    const fresh = r.ok
      ? new DOMParser().parseFromString(await r.text(), "text/html").getElementById("gb-page")
      : null;
    if (!fresh) throw new Error(`the page could not be refreshed (${r.status}): reload it`);
    const open = [...document.querySelectorAll("tr.gb-history.show")].map((x) => x.dataset.account);
    document.getElementById("gb-page").replaceWith(document.adoptNode(fresh));
    for (const a of open) openHistory(a);
    renderTimes();
  }
  function openHistory(account) {
    const row = document.querySelector(`tr.gb-history[data-account="${CSS.escape(account)}"]`);
    if (row) row.classList.add("show");
  }
  // after an accepted change: refresh now (what the ledger says), then once the scheduler has
  // run on it (what it computes: standings, a drained node found empty)
  async function refreshAfter(done, then, later) {
    flash(done);
    // while set, the page is still catching up with the change (tests wait for it to clear)
    document.body.dataset.gbRefreshing = String(Number(document.body.dataset.gbRefreshing || 0) + 1);
    try {
      await refresh();
      if (then) then();
      await afterNextCycle();
      await refresh();
      if (then) then();
      if (later) flash(later);
    } catch (e) {
      flash(`${done} ${e.message}`, "warning");
    } finally {
      const left = Number(document.body.dataset.gbRefreshing) - 1;
      if (left > 0) document.body.dataset.gbRefreshing = String(left);
      else delete document.body.dataset.gbRefreshing;
    }
  }
  // GPU-hours as the pages write them: one decimal below 100, none above
  const fmt = (x) => {
    if (x === null || x === undefined) return "—";
    const d = Math.abs(x) < 100 ? 1 : 0;
    return Number(x).toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: d });
  };
  const pct = (x) => (x === null || x === undefined ? "no grant"
    : `${Number(100 * x).toLocaleString("en-US", { maximumFractionDigits: 1, minimumFractionDigits: 1 })} %`);
  const share = (x) => (x === null || x === undefined ? "—" : `${Math.round(100 * x)} %`);

  // ------------------------------------------------------------------ grant editor
  const modalEl = document.getElementById("gb-grant-modal");
  if (modalEl) {
    const modal = new bootstrap.Modal(modalEl);
    const close = closer(modalEl, modal);
    const form = document.getElementById("gb-grant-form");
    const value = document.getElementById("gb-grant-value");
    const note = document.getElementById("gb-grant-note");
    const unit = document.getElementById("gb-grant-unit");
    const err = document.getElementById("gb-grant-error");
    const save = document.getElementById("gb-grant-save");
    const prevBox = document.getElementById("gb-preview");
    const hint = document.getElementById("gb-grant-save-hint");
    let account = null;

    function body() {
      const share = document.getElementById("gb-mode-share").checked;
      const v = parseFloat(value.value);
      const b = { note: note.value.trim() };
      if (share) b.share_pct = v; else b.grant_hours = v;
      return b;
    }
    // Save waits for a preview of exactly what is saved; the hint next to it says so
    function invalidate() {
      save.disabled = true;
      hint.textContent = "Preview the effect first: Save is enabled once you have seen what would change.";
      hint.classList.remove("d-none");
      prevBox.classList.add("d-none");
      err.classList.add("d-none");
    }
    function check() {
      const v = parseFloat(value.value);
      if (Number.isNaN(v) || v < 0) { show(err, "Give the new grant as a number (0 or more)."); return false; }
      if (document.getElementById("gb-mode-share").checked && v > 100) { show(err, "A share is at most 100 %."); return false; }
      if (!note.value.trim()) { show(err, "Write a note saying why: it is kept in the grant's history."); return false; }
      return true;
    }
    document.addEventListener("click", (ev) => {
      const b = ev.target.closest(".gb-edit");
      if (!b) return;
      {
        account = b.dataset.account;
        modalEl.querySelector(".gb-acct").textContent = account;
        modalEl.querySelector(".gb-parent").textContent = b.dataset.parent || "the cluster";
        const share = b.dataset.sharePct !== "";
        document.getElementById("gb-mode-share").checked = share;
        document.getElementById("gb-mode-hours").checked = !share;
        unit.textContent = share ? "%" : "GPU-h";
        value.value = share ? b.dataset.sharePct : b.dataset.grantHours;
        note.value = "";
        invalidate();
        save.textContent = "Save";
        modal.show();
      }
    });
    for (const el of [value, note]) el.addEventListener("input", invalidate);
    for (const r of form.querySelectorAll("input[name=mode]")) {
      r.addEventListener("change", () => {
        unit.textContent = document.getElementById("gb-mode-share").checked ? "%" : "GPU-h";
        invalidate();
      });
    }
    document.getElementById("gb-grant-preview").addEventListener("click", async () => {
      invalidate();
      if (!check()) return;
      try {
        const p = await call("POST", `/accounts/${encodeURIComponent(account)}/grant/preview`, body());
        const tbody = document.querySelector("#gb-preview-table tbody");
        tbody.replaceChildren();
        for (const [name, a] of Object.entries(p.accounts)) {
          const tr = document.createElement("tr");
          tr.dataset.account = name;
          const cells = [name, `${fmt(a.grant_before)} GPU-h`, `${fmt(a.grant_after)} GPU-h`,
                         `${share(a.share_before)} → ${share(a.share_after)}`,
                         pct(a.standing_before), pct(a.standing_after)];
          cells.forEach((c, i) => {
            const td = document.createElement("td");
            td.textContent = c;
            if (i) td.className = "text-end text-nowrap";
            if (i === 5 || i === 2) td.classList.add("fw-semibold");
            tr.appendChild(td);
          });
          tbody.appendChild(tr);
        }
        const ul = document.getElementById("gb-preview-backing");
        ul.replaceChildren();
        for (const b of p.backing) {
          const li = document.createElement("li");
          li.textContent = `Waiting work ${b.workload} of ${b.project} would become `
            + (b.backed_after ? "backed (protected, considered first)" : "unbacked (runs only on idle GPUs)");
          ul.appendChild(li);
        }
        if (!p.backing.length) {
          const li = document.createElement("li");
          li.textContent = "No waiting work changes between backed and unbacked.";
          ul.appendChild(li);
        }
        prevBox.classList.remove("d-none");
        if (p.refused) {
          show(err, `This change would be refused: ${p.refused}`);
          hint.textContent = "Save stays off: this change would be refused (see above).";
        } else {
          save.disabled = false;
          hint.classList.add("d-none");
        }
      } catch (e) {
        show(err, e.message);
      }
    });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (save.disabled || !check()) return;
      save.disabled = true;
      save.textContent = "Saving…";
      let saved;
      try {
        saved = await call("PUT", `/accounts/${encodeURIComponent(account)}/grant`, body());
      } catch (e) {
        show(err, e.message);
        save.textContent = "Save";
        save.disabled = false;
        return;
      }
      close();
      const g = saved.grant;
      const what = g.grant_hours !== null ? `${fmt(g.grant_hours)} GPU-h` : `${g.share_pct} % of its parent`;
      const changed = account;
      refreshAfter(`The grant of ${changed} is now ${what}; its new standing shows after the next scheduling cycle.`,
        () => openHistory(changed), `The grant of ${changed} is now ${what}; the figures below include it.`);
    });
  }

  // ------------------------------------------------------------------ admin actions
  const confirmEl = document.getElementById("gb-confirm");
  if (confirmEl) {
    const modal = new bootstrap.Modal(confirmEl);
    const close = closer(confirmEl, modal);
    const text = document.getElementById("gb-confirm-text");
    const box = document.getElementById("gb-confirm-reason-box");
    const reason = document.getElementById("gb-confirm-reason");
    const label = document.getElementById("gb-confirm-reason-label");
    const err = document.getElementById("gb-confirm-error");
    const ok = document.getElementById("gb-confirm-ok");
    let action = null;
    const actions = {
      drain: (el) => ({
        title: `Drain node ${el.dataset.node}?`,
        text: "Nothing new will be placed on it. Work without protection leaves at once and is requeued elsewhere; protected work keeps its protected time, then leaves. You are told when it is ready for repair.",
        reason: "Why (shown to everyone, kept in the audit log)", required: true, button: "Drain",
        busy: "Draining…",
        run: (r) => call("PUT", `/nodes/${encodeURIComponent(el.dataset.node)}/health`, { healthy: false, reason: r }),
        done: (n) => `Node ${n.name} is ${n.state_text}.`,
      }),
      undrain: (el) => ({
        title: `Return node ${el.dataset.node} to service?`,
        text: "Work will be placed on it again.",
        reason: "Note (what was repaired)", required: false, button: "Return to service",
        busy: "Returning…",
        run: (r) => call("PUT", `/nodes/${encodeURIComponent(el.dataset.node)}/health`, { healthy: true, reason: r }),
        done: (n) => `Node ${n.name} is ${n.state_text}.`,
      }),
      cancel: (el) => ({
        title: el.dataset.kind === "interactive" ? `Stop session ${el.dataset.workload}?` : `Cancel ${el.dataset.workload}?`,
        text: el.dataset.kind === "interactive"
          ? "The user's notebook server is stopped and its charge ends."
          : "The job is stopped (if running) and will not run again.",
        button: el.dataset.kind === "interactive" ? "Stop it" : "Cancel it",
        run: () => call("DELETE", el.dataset.kind === "interactive"
          ? `/sessions/${encodeURIComponent(el.dataset.workload)}?reason=stop`
          : `/jobs/${encodeURIComponent(el.dataset.workload)}`),
        done: () => `${el.dataset.kind === "interactive" ? "Session" : "Job"} ${el.dataset.workload} was ${el.dataset.kind === "interactive" ? "stopped" : "cancelled"}.`,
      }),
      requeue: (el) => ({
        title: `Requeue ${el.dataset.workload}?`,
        text: "The job is stopped now and put back in the queue; it starts again when its turn comes (charged only for the time it ran).",
        button: "Requeue",
        run: () => call("POST", `/workloads/${encodeURIComponent(el.dataset.workload)}/requeue`),
        done: () => `Job ${el.dataset.workload} was stopped and put back in the queue.`,
      }),
    };
    document.addEventListener("click", (ev) => {
      const el = ev.target.closest(".gb-act");
      if (!el) return;
      {
        action = actions[el.dataset.act](el);
        document.getElementById("gb-confirm-title").textContent = action.title;
        text.textContent = action.text;
        box.classList.toggle("d-none", !action.reason);
        label.textContent = action.reason || "";
        reason.value = "";
        err.classList.add("d-none");
        ok.textContent = action.button;
        ok.className = `btn ${el.dataset.act === "undrain" ? "btn-success" : "btn-danger"}`;
        ok.disabled = false;
        modal.show();
      }
    });
    document.getElementById("gb-confirm-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (action.required && !reason.value.trim()) {
        show(err, "Please say why.");
        return;
      }
      const a = action, label = ok.textContent;
      ok.disabled = true;
      ok.textContent = a.busy || "Working…";
      err.classList.add("d-none");
      let out;
      try {
        out = await a.run(reason.value.trim());
      } catch (e) {
        show(err, e.message);
        ok.textContent = label;
        ok.disabled = false;
        return;
      }
      close();
      refreshAfter(a.done(out || {}));
    });
  }

  // ------------------------------------------------------------------ the audit page
  // its times are the browser's: the filter and the CSV download carry its time zone
  for (const el of document.querySelectorAll("input.gb-tz")) if (!el.value) el.value = tz;
  const csv = document.getElementById("gb-audit-csv");
  if (csv && !/[?&]tz=/.test(csv.href)) csv.href += `&tz=${encodeURIComponent(tz)}`;
})();
