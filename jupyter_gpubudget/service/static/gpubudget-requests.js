// The Budget requests page: Grant and Decline through the REST API with JupyterHub's XSRF
// token (the _xsrf cookie, sent as X-XSRFToken); the page is reloaded once a change is accepted.
(function () {
  "use strict";
  const root = document.getElementById("gb-requests");
  if (!root) return;
  const api = root.dataset.api;
  const err = document.getElementById("gb-req-error");
  function xsrf() {
    const c = document.cookie.split("; ").find((x) => x.startsWith("_xsrf="));
    return c ? decodeURIComponent(c.slice(6)) : "";
  }
  async function decide(id, verb, body) {
    err.classList.add("d-none");
    const r = await fetch(`${api}/budget-requests/${encodeURIComponent(id)}/${verb}`, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-XSRFToken": xsrf() },
      body: JSON.stringify(body),
    });
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      err.textContent = `Not done: ${(data && data.message) || r.status}`;
      err.classList.remove("d-none");
      return;
    }
    location.reload();
  }
  root.addEventListener("click", (ev) => {
    const b = ev.target.closest("button.gb-req");
    if (!b) return;
    if (b.dataset.verb === "grant") {
      b.disabled = true;
      decide(b.dataset.request, "grant", {}).finally(() => { b.disabled = false; });
    } else {
      const row = root.querySelector(`tr.gb-req-form[data-request="${b.dataset.request}"]`);
      row.classList.remove("d-none");
      row.querySelector("input").focus();
    }
  });
  root.addEventListener("submit", (ev) => {
    const row = ev.target.closest("tr.gb-req-form");
    if (!row) return;
    ev.preventDefault();
    const reason = row.querySelector("input").value.trim();
    if (reason) decide(row.dataset.request, "decline", { reason });
  });
})();
