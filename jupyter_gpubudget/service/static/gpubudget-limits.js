// The Accounts page's members' limits: Save limit (PUT) and Remove (DELETE) through the REST
// API with JupyterHub's XSRF token (the _xsrf cookie, sent as X-XSRFToken); a refused change
// shows the service's reason under its project's table, an accepted one reloads the page.
(function () {
  "use strict";
  if (window.gbLimits) return; // the page's content may be swapped in place: listen once
  window.gbLimits = true;
  function xsrf() {
    const c = document.cookie.split("; ").find((x) => x.startsWith("_xsrf="));
    return c ? decodeURIComponent(c.slice(6)) : "";
  }
  function say(row, text) {
    const err = row.closest(".gb-limits-project").querySelector(".gb-limit-error");
    err.textContent = text;
    err.classList.toggle("d-none", !text);
  }
  function number(input, what) {
    const raw = input.value.trim();
    if (raw === "") return null;
    if (input.validity.badInput || !Number.isFinite(Number(raw))) throw new Error(`${what}: not a number`);
    return Number(raw);
  }
  async function send(row, method, body) {
    const root = document.getElementById("gb-limits");
    const url = `${root.dataset.api}/accounts/${encodeURIComponent(row.dataset.project)}` +
      `/member_limits/${encodeURIComponent(row.dataset.user)}`;
    const init = { method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-XSRFToken": xsrf() } };
    if (body) init.body = JSON.stringify(body);
    const r = await fetch(url, init);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      say(row, `Not saved (${row.dataset.user} in ${row.dataset.project}): ${(data && data.message) || r.status}`);
      return;
    }
    location.reload();
  }
  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("#gb-limits button.gb-limit-save, #gb-limits button.gb-limit-remove");
    if (!b) return;
    const row = b.closest("tr.gb-limit");
    say(row, "");
    let body = null;
    if (b.classList.contains("gb-limit-save")) {
      try {
        body = { gpu_hours: number(row.querySelector(".gb-limit-hours-in"), "GPU-hours"),
                 gpus: number(row.querySelector(".gb-limit-gpus-in"), "GPUs") };
      } catch (e) { say(row, `Not saved: ${e.message}`); return; }
      if (body.gpu_hours === null && body.gpus === null) {
        say(row, "Not saved: give a GPU-hour limit, a GPU limit or both (Remove lifts the limit).");
        return;
      }
    }
    b.disabled = true;
    send(row, body ? "PUT" : "DELETE", body)
      .catch((e) => say(row, `Not saved: ${e.message}`))
      .finally(() => { b.disabled = false; });
  });
})();
