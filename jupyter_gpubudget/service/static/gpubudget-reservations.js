// The Reservations page: book (the day and times are the browser's local time, sent as epoch
// seconds) and cancel through the REST API with JupyterHub's XSRF token (the _xsrf cookie, sent
// as X-XSRFToken); the page is reloaded once a change is accepted, a refusal is shown with the
// service's reason.
(function () {
  "use strict";
  const root = document.getElementById("gb-reservations");
  if (!root) return;
  const api = root.dataset.api;
  const err = document.getElementById("gb-res-error");
  function xsrf() {
    const c = document.cookie.split("; ").find((x) => x.startsWith("_xsrf="));
    return c ? decodeURIComponent(c.slice(6)) : "";
  }
  async function call(method, path, body) {
    err.classList.add("d-none");
    const r = await fetch(api + path, {
      method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-XSRFToken": xsrf() },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      err.textContent = `Not booked: ${(data && data.message) || r.status}`;
      if (method === "DELETE") err.textContent = `Not cancelled: ${(data && data.message) || r.status}`;
      err.classList.remove("d-none");
      return null;
    }
    location.reload();
    return data;
  }
  const form = document.getElementById("gb-book");
  if (form) {
    const day = form.querySelector("[name=day]");
    if (!day.value) {  // tomorrow, in local time
      const t = new Date(Date.now() + 86400000);
      day.value = `${t.getFullYear()}-${String(t.getMonth() + 1).padStart(2, "0")}-${String(t.getDate()).padStart(2, "0")}`;
    }
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = (k) => form.querySelector(`[name=${k}]`).value;
      const start = new Date(`${v("day")}T${v("from")}`).getTime() / 1000;
      const end = new Date(`${v("day")}T${v("to")}`).getTime() / 1000;
      const body = { project: v("project"), gpus: parseInt(v("gpus"), 10), start, end };
      if (v("node")) body.nodes = [v("node")];
      if (v("note").trim()) body.note = v("note").trim();
      const b = document.getElementById("gb-book-submit");
      b.disabled = true;
      call("POST", "/reservations", body).finally(() => { b.disabled = false; });
    });
  }
  root.addEventListener("click", (ev) => {
    const b = ev.target.closest("button.gb-res-cancel");
    if (!b) return;
    b.disabled = true;
    call("DELETE", `/reservations/${encodeURIComponent(b.dataset.reservation)}`)
      .finally(() => { b.disabled = false; });
  });
})();
