// The Reports page: asks GET /reports for the chosen account and period in the browser's time
// zone and draws its pictures as inline SVG (no library): charged GPU-hours split into busy,
// idle and unknown (never measured) per project over time, the same split per user, and the
// sessions that held GPUs idle longest. Busy time that nothing measured is drawn hatched and
// called "unknown", never 0. The CSV link is the API's own CSV of the same report.
"use strict";

(function () {
  const form = document.getElementById("gb-report-form");
  if (!form) return;
  const api = form.dataset.api;
  const tz = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const out = document.getElementById("gb-report");
  const errBox = document.getElementById("gb-report-error");
  const csv = document.getElementById("gb-report-csv");
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = { busy: "#1f6feb", idle: "#f59f00", unknown: "url(#gb-hatch)" };
  const WORDS = { busy: "busy (computing)", idle: "idle (held, not computing)",
    unknown: "unknown (not measured)" };

  function isoDay(d) {
    return `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`;
  }
  function h(x) {
    if (x === null || x === undefined) return "unknown";
    const a = Math.abs(x);
    return a >= 100 ? x.toLocaleString("en-GB", { maximumFractionDigits: 0 })
      : a >= 10 ? x.toFixed(1) : a >= 0.1 ? x.toFixed(2) : x === 0 ? "0" : x.toFixed(3);
  }
  function dur(s) {
    if (s === null || s === undefined) return "—";
    if (s < 90) return `${Math.round(s)} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} d`;
  }
  // a figure's split: busy, idle (measured, not busy) and unknown (charged, never measured)
  function split(f) {
    const charged = f.charged_gpu_h || 0, measured = f.measured_gpu_h || 0;
    const busy = f.busy_gpu_h === null ? 0 : f.busy_gpu_h;
    const idle = f.idle_gpu_h === null ? 0 : f.idle_gpu_h;
    return { busy, idle, unknown: Math.max(0, charged - measured), charged };
  }
  function el(tag, attrs = {}, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function html(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svgRoot(w, hgt, label) {
    const s = el("svg", { viewBox: `0 0 ${w} ${hgt}`, width: "100%", role: "img",
      "aria-label": label, class: "gb-chart", preserveAspectRatio: "xMinYMin meet" });
    const defs = el("defs");
    const p = el("pattern", { id: "gb-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(45)" });
    p.appendChild(el("rect", { width: 6, height: 6, fill: "#e9ecef" }));
    p.appendChild(el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#adb5bd", "stroke-width": 3 }));
    defs.appendChild(p);
    s.appendChild(defs);
    return s;
  }
  function legend() {
    const d = html("div", "d-flex flex-wrap gap-3 small mb-2 gb-chart-legend");
    for (const k of ["busy", "idle", "unknown"]) {
      const item = html("span", "d-inline-flex align-items-center gap-1");
      const sw = svgRoot(14, 14, "");
      sw.setAttribute("width", "14");
      sw.setAttribute("height", "14");
      sw.appendChild(el("rect", { width: 14, height: 14, fill: COLOURS[k], stroke: "#6c757d", "stroke-width": 0.5 }));
      item.append(sw, document.createTextNode(WORDS[k]));
      d.appendChild(item);
    }
    d.appendChild(html("span", "text-body-secondary", "· bar length = charged GPU-hours"));
    return d;
  }
  function niceMax(x) {
    if (x <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }
  function tip(node, text) { node.appendChild(el("title", {}, text)); return node; }
  function figText(f) {
    const s = split(f);
    const busy = f.busy_gpu_h === null ? "unknown (not measured)" : `${h(f.busy_gpu_h)} GPU-h`;
    let t = `charged ${h(s.charged)} GPU-h, busy ${busy}`;
    if (f.idle_gpu_h !== null) t += `, idle ${h(f.idle_gpu_h)} GPU-h`;
    if (f.busy_gpu_h !== null && s.unknown > 1e-9) t += `, not measured ${h(s.unknown)} GPU-h`;
    return t;
  }

  // charged (stacked busy / idle / unknown) per project, one column per day or week
  function overTime(rep) {
    const box = html("section", "mb-4");
    box.id = "gb-chart-time";
    box.appendChild(html("h2", "h5", `Charged and busy GPU-hours per project, by ${rep.by}`));
    const periods = rep.periods || [];
    if (!periods.length) {
      box.appendChild(html("p", "text-body-secondary", "Nothing was charged in this period."));
      return box;
    }
    box.appendChild(legend());
    const projects = rep.projects.map((p) => p.project).filter((p) =>
      periods.some((per) => per.projects.some((e) => e.project === p)));
    const starts = periods.map((p) => p.start);
    // every day (or week) of the period gets its column, with or without usage
    const cols = [];
    const step = rep.by === "week" ? 7 : 1;
    const d = new Date(rep.from * 1000);
    while (d.getTime() / 1000 < rep.to - 1 && cols.length < 800) {
      cols.push(new Date(d));
      d.setDate(d.getDate() + step);
    }
    if (rep.by === "week" && cols.length && starts[0] < cols[0].getTime() / 1000) cols.unshift(new Date(starts[0] * 1000));
    const key = (t) => isoDay(new Date(t * 1000));
    const byKey = new Map(periods.map((p) => [key(p.start), p]));
    let max = 0;
    for (const per of periods) for (const e of per.projects) max = Math.max(max, e.charged_gpu_h);
    max = niceMax(max);
    const W = 900, rowH = 110, left = 150, right = 10, top = 8, axis = 28;
    const Hh = projects.length * rowH + axis + top;
    const s = svgRoot(W, Hh, "Charged and busy GPU-hours per project over time");
    const cw = (W - left - right) / cols.length;
    projects.forEach((p, i) => {
      const y0 = top + i * rowH, base = y0 + rowH - 14;
      const g = el("g", { class: "gb-project-row", "data-project": p });
      g.appendChild(el("text", { x: left - 8, y: y0 + rowH / 2, "text-anchor": "end", "font-size": 13, fill: "currentColor" }, p));
      g.appendChild(el("line", { x1: left, x2: W - right, y1: base, y2: base, stroke: "#adb5bd" }));
      g.appendChild(el("text", { x: left + 2, y: y0 + 10, "font-size": 10, fill: "#6c757d" }, `${h(max)} GPU-h`));
      g.appendChild(el("line", { x1: left, x2: W - right, y1: y0 + 14, y2: y0 + 14, stroke: "#dee2e6", "stroke-dasharray": "3 3" }));
      const scale = (rowH - 28) / max;
      cols.forEach((c, j) => {
        const per = byKey.get(isoDay(c));
        const e = per && per.projects.find((x) => x.project === p);
        if (!e) return;
        const sp = split(e);
        let y = base;
        const x = left + j * cw + cw * 0.12, w = Math.max(1, cw * 0.76);
        const col = el("g", { class: "gb-bar", "data-start": key(per.start), "data-charged": e.charged_gpu_h,
          "data-busy": e.busy_gpu_h === null ? "unknown" : e.busy_gpu_h });
        for (const k of ["busy", "idle", "unknown"]) {
          const hh = sp[k] * scale;
          if (hh <= 0) continue;
          y -= hh;
          col.appendChild(el("rect", { x, y, width: w, height: hh, fill: COLOURS[k], class: `gb-${k}` }));
        }
        tip(col, `${p}, ${per.start_local.slice(0, 10)}: ${figText(e)}`);
        g.appendChild(col);
      });
      s.appendChild(g);
    });
    // date labels under the last row, at most ~16
    const every = Math.max(1, Math.ceil(cols.length / 16));
    const fmt = new Intl.DateTimeFormat("en-GB", { weekday: rep.by === "day" && cols.length <= 14 ? "short" : undefined, day: "numeric", month: "short" });
    cols.forEach((c, j) => {
      if (j % every) return;
      s.appendChild(el("text", { x: left + j * cw + cw / 2, y: Hh - 8, "text-anchor": "middle", "font-size": 11, fill: "currentColor" },
        (rep.by === "week" ? "wk of " : "") + fmt.format(c)));
    });
    box.appendChild(s);
    return box;
  }

  // one horizontal bar per labelled figure (users, sessions)
  function bars(id, title, rows, empty, label) {
    const box = html("section", "mb-4");
    box.id = id;
    box.appendChild(html("h2", "h5", title));
    if (!rows.length) {
      box.appendChild(html("p", "text-body-secondary", empty));
      return box;
    }
    box.appendChild(legend());
    const W = 900, rowH = 26, left = 240, right = 250;
    const s = svgRoot(W, rows.length * rowH + 6, title);
    const max = niceMax(Math.max(...rows.map((r) => r.f.charged_gpu_h)));
    const scale = (W - left - right) / max;
    rows.forEach((r, i) => {
      const y = 3 + i * rowH;
      const g = el("g", { class: "gb-bar", "data-label": r.label, "data-charged": r.f.charged_gpu_h,
        "data-busy": r.f.busy_gpu_h === null ? "unknown" : r.f.busy_gpu_h });
      g.appendChild(el("text", { x: left - 8, y: y + 16, "text-anchor": "end", "font-size": 13, fill: "currentColor" }, r.label));
      let x = left;
      const sp = split(r.f);
      for (const k of ["busy", "idle", "unknown"]) {
        const w = sp[k] * scale;
        if (w <= 0) continue;
        g.appendChild(el("rect", { x, y: y + 3, width: w, height: rowH - 8, fill: COLOURS[k], class: `gb-${k}` }));
        x += w;
      }
      g.appendChild(el("text", { x: x + 6, y: y + 16, "font-size": 12, fill: "currentColor" }, label(r.f)));
      tip(g, `${r.label}: ${figText(r.f)}`);
      s.appendChild(g);
    });
    box.appendChild(s);
    return box;
  }
  function userText(f) {
    const b = f.busy_gpu_h === null ? "busy unknown" : `${h(f.busy_gpu_h)} busy`;
    return `${h(f.charged_gpu_h)} GPU-h charged, ${b}`;
  }
  function sessionText(f) {
    return `${h(f.idle_gpu_h)} GPU-h idle of ${h(f.measured_gpu_h)} measured`;
  }

  function tiles(rep) {
    const t = rep.totals;
    const row = html("div", "row g-2 mb-3");
    row.id = "gb-report-totals";
    const sp = split(t);
    const grant = t.grant_gpu_h === null || t.grant_gpu_h === undefined ? null : t.grant_gpu_h;
    const items = [
      ["charged", "Charged", `${h(t.charged_gpu_h)} GPU-h`, grant === null ? "no grant of its own" : `its grant over these dates: ${h(grant)} GPU-h`],
      ["busy", "Busy", t.busy_gpu_h === null ? "unknown" : `${h(t.busy_gpu_h)} GPU-h`,
        t.busy_gpu_h === null ? "no GPU of this work was measured" : `${Math.round(100 * (1 - t.idle_share))} % of the measured time`],
      ["idle", "Idle", t.idle_gpu_h === null ? "unknown" : `${h(t.idle_gpu_h)} GPU-h`,
        sp.unknown > 1e-9 ? `${h(sp.unknown)} GPU-h were not measured` : "held but not computing"],
      ["preemptions", "Preemptions", String(t.preemptions), "work stopped for other work"],
    ];
    const waits = Object.entries(rep.waits || {});
    if (waits.length) {
      items.push(["wait", "Wait before start", waits.map(([k, w]) => `${k} ${dur(w.p50_s)}`).join(", "), "median, by kind of work"]);
    }
    for (const [k, label, value, sub] of items) {
      const c = html("div", "col-6 col-lg");
      const card = html("div", "border rounded p-2 h-100");
      card.dataset.figure = k;
      card.append(html("div", "small text-body-secondary", label), html("div", "fs-5 fw-semibold gb-value", value), html("div", "small text-body-secondary", sub));
      c.appendChild(card);
      row.appendChild(c);
    }
    return row;
  }

  function render(rep) {
    out.replaceChildren();
    const from = new Date(rep.from * 1000), to = new Date(rep.to * 1000 - 1000);
    const df = new Intl.DateTimeFormat("en-GB", { weekday: "short", day: "numeric", month: "short", year: "numeric" });
    const head = html("p", "mb-2", "");
    head.id = "gb-report-period";
    head.append(html("b", "", rep.account), document.createTextNode(` — ${df.format(from)} to ${df.format(to)} (both included)`));
    out.append(head, tiles(rep), overTime(rep));
    const users = [];
    for (const p of rep.projects) for (const u of p.users) users.push({ label: `${u.user} · ${p.project}`, f: u });
    users.sort((a, b) => b.f.charged_gpu_h - a.f.charged_gpu_h);
    out.appendChild(bars("gb-chart-users", "Per user", users.filter((u) => u.f.charged_gpu_h > 1e-9),
      "Nobody was charged in this period.", userText));
    const sessions = (rep.idle_sessions || []).map((x) => ({
      label: `${x.name || x.workload} (${x.user}, ${x.project})`,
      f: { charged_gpu_h: x.measured_gpu_h, measured_gpu_h: x.measured_gpu_h, busy_gpu_h: x.busy_gpu_h,
        idle_gpu_h: x.idle_gpu_h, idle_share: x.measured_gpu_h ? x.idle_gpu_h / x.measured_gpu_h : null },
    }));
    out.appendChild(bars("gb-chart-idle", "Notebook sessions that held GPUs idle longest", sessions,
      "No measured notebook session in this period (busy time is measured only where a sampler watches the GPUs).", sessionText));
  }

  function params() {
    const q = new URLSearchParams({ account: $("r-account").value, tz });
    const period = $("r-period").value;
    if (period === "range") {
      q.set("from", $("r-from").value);
      q.set("to", $("r-to").value);
      const days = (new Date($("r-to").value) - new Date($("r-from").value)) / 86400000;
      q.set("by", days > 62 ? "week" : "day");
    } else {
      q.set("period", period);
      if ($("r-at").value) q.set("at", $("r-at").value);
      q.set("by", period === "month" || period === "week" || period === "day" ? "day" : "week");
    }
    return q;
  }
  function showRange() {
    const range = $("r-period").value === "range";
    for (const e of form.querySelectorAll(".gb-r-range")) e.classList.toggle("d-none", !range);
    for (const e of form.querySelectorAll(".gb-r-at")) e.classList.toggle("d-none", range);
  }
  async function load() {
    const q = params();
    const csvq = new URLSearchParams(q);
    csvq.set("format", "csv");
    csv.href = `${api}?${csvq}`;
    history.replaceState(null, "", `?${q}`);
    errBox.classList.add("d-none");
    out.setAttribute("aria-busy", "true");
    try {
      // JupyterHub's XSRF token (the _xsrf cookie): a fetch with the login cookie needs it
      const c = document.cookie.split("; ").find((x) => x.startsWith("_xsrf="));
      const r = await fetch(`${api}?${q}`, {
        credentials: "same-origin", cache: "no-store",
        headers: { "X-XSRFToken": c ? decodeURIComponent(c.slice(6)) : "" },
      });
      const data = await r.json().catch(() => null);
      if (!r.ok) throw new Error((data && data.message) || `${r.status} ${r.statusText}`);
      render(data);
      out.dataset.loaded = `${q}`;
    } catch (e) {
      out.replaceChildren();
      errBox.textContent = `This report cannot be shown — ${e.message}`;
      errBox.classList.remove("d-none");
    } finally {
      out.removeAttribute("aria-busy");
    }
  }
  // the form starts from the address (a shared link) or today
  const start = new URLSearchParams(location.search);
  if (start.get("account") && [...$("r-account").options].some((o) => o.value === start.get("account"))) $("r-account").value = start.get("account");
  if (start.get("from") && start.get("to")) {
    $("r-period").value = "range";
    $("r-from").value = start.get("from");
    $("r-to").value = start.get("to");
  } else if (["day", "week", "month"].includes(start.get("period"))) {
    $("r-period").value = start.get("period");
  }
  $("r-at").value = start.get("at") || isoDay(new Date());
  if (!$("r-from").value) {
    const d = new Date();
    $("r-to").value = isoDay(d);
    d.setDate(d.getDate() - 29);
    $("r-from").value = isoDay(d);
  }
  showRange();
  $("r-period").addEventListener("change", () => { showRange(); load(); });
  for (const id of ["r-account", "r-at", "r-from", "r-to"]) $(id).addEventListener("change", load);
  form.addEventListener("submit", (e) => { e.preventDefault(); load(); });
  load();
})();
