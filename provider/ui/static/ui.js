// faas-gpu status page: polls /ui/api/status and draws it; the invoke form posts to /function/<name>.
//
// Every value shown comes from elsewhere (function names, model digests, node names, messages):
// the DOM is built with createElement and textContent only, never innerHTML, so none of it is
// ever parsed as markup. URLs are built from location.origin: a page opened as
// http://user:pass@host/ui/ would otherwise resolve relative URLs with the credentials in them,
// which fetch refuses; the browser sends the basic auth it holds for this origin by itself.
"use strict";

(function () {
  const REFRESH_MS = 2000;
  const api = (path) => new URL(path, window.location.origin);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else node[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }

  const $ = (id) => document.getElementById(id);
  const fmt = (x, digits) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
  const short = (digest) => (digest.length > 19 ? digest.slice(0, 19) + "…" : digest);

  function show(id, visible) {
    $(id).hidden = !visible;
  }

  // -- functions ----------------------------------------------------------------------------
  // Ready green; Idle (scaled to zero on purpose) neutral; anything else (Not Ready, StartFailed,
  // CrashLooping, ...) red
  function badgeClass(state) {
    return state === "Ready" ? "Ready" : state === "Idle" ? "neutral" : "bad";
  }

  function renderFunctions(fns) {
    const rows = fns.items.map((f) => {
      const att = f.slo.attainment;
      const sloCell =
        att === null
          ? el("td", { className: "num muted" }, "–")
          : el("td", { className: "num", title: `${f.slo.met} met, ${f.slo.missed} missed` },
              `${(att * 100).toFixed(1)}% (${f.slo.met}/${f.slo.met + f.slo.missed})`);
      return el(
        "tr",
        { dataset: { function: f.name, namespace: f.namespace } },
        el("td", {}, el("strong", { className: "fn-name" }, f.name), el("span", { className: "muted" }, "." + f.namespace)),
        el("td", { title: f.message },
          el("span", { className: "badge " + badgeClass(f.state) }, f.state),
          f.rollout ? el("span", { className: "badge rollout " + (f.rollout === "Stalled" ? "busy" : "") }, "rollout " + f.rollout.toLowerCase()) : ""),
        el("td", { className: "num replicas" }, `${f.availableReplicas}/${f.replicas}`),
        el("td", { className: "num invocations" }, String(f.invocations)),
        el("td", { className: "num rate" }, fmt(f.ratePerSecond, 2)),
        el("td", { className: "num" }, f.sloMs === null ? "–" : `${f.sloMs} ms`),
        sloCell
      );
    });
    $("functions").tBodies[0].replaceChildren(...rows);
    show("functions-empty", rows.length === 0);
    show("functions-unrecorded", fns.recording === false);
    $("functions-error").textContent = fns.error ? "function store: " + fns.error : "";
    show("functions-error", Boolean(fns.error));
    updateInvokeChoices(fns.items.map((f) => f.invokeName));
  }

  // -- units --------------------------------------------------------------------------------
  function modelItem(m) {
    const who = m.functions.length ? m.functions.join(", ") : "uploaded by no function known";
    return el("li", { className: "model", title: m.digest, dataset: { digest: m.digest } },
      el("code", {}, short(m.digest)), " ", el("span", { className: "owners" }, who));
  }

  function renderUnits(units) {
    const cards = units.map((u) => {
      const mem = el("meter", { min: 0, max: u.memoryMb || 1, value: u.usedMb || 0, className: "memory" });
      const what = [...new Set([u.kind, u.name, u.gpuName, u.profile].filter(Boolean))].join(" · ");
      const state = u.cordoned ? "cordoned" : u.state;
      const running = u.running
        ? el("div", { className: "running" }, "running ", el("code", {}, short(u.running.digest)),
            u.running.functions.length ? " (" + u.running.functions.join(", ") + ")" : "",
            u.busyForS ? ` for ${fmt(u.busyForS, 1)} s` : "")
        : el("div", { className: "running muted" }, "no job running");
      return el(
        "div",
        { className: "unit", dataset: { unit: u.key } },
        el("h3", {}, u.key, " ", el("span", { className: "badge " + state }, state)),
        el("div", { className: "meta" }, what),
        mem,
        el("div", { className: "meta memory-text" }, `${fmt(u.usedMb, 0)} / ${fmt(u.memoryMb, 0)} MB cached`),
        running,
        el("div", { className: "queue" }, "queued here: ", u.queued === null ? "unknown" : String(u.queued)),
        el("div", { className: "meta" }, `cached models (${u.models.length}, least recently used first)`),
        el("ul", { className: "models" }, ...u.models.map(modelItem))
      );
    });
    $("units").replaceChildren(...cards);
    show("units-empty", cards.length === 0);
  }

  // -- scheduler, reconfigurations, procurement --------------------------------------------
  function pairs(dl, entries) {
    const nodes = [];
    for (const [k, v] of entries) nodes.push(el("dt", {}, k), el("dd", {}, v === null || v === undefined ? "–" : String(v)));
    dl.replaceChildren(...nodes);
  }

  function renderScheduler(s) {
    if (!s.configured) {
      pairs($("scheduler"), [["scheduler", "none: functions run their models in their own instances"]]);
      return;
    }
    const entries = [
      ["leader", s.leaderId],
      ["replicas", s.members.length ? s.members.join(", ") : "none announced"],
    ];
    if (s.error) entries.push(["queues", "unknown: " + s.error]);
    else {
      entries.push(
        ["asked", s.url + (s.answeredByLeader ? " (leader)" : " (not the leader)")],
        ["waiting, strict", s.queues.strict],
        ["waiting, best effort", s.queues.bestEffort],
        ["queued in all", s.queued],
        ["deadline misses", s.deadlineMisses],
        ["job distribution", s.distribution]
      );
    }
    pairs($("scheduler"), entries);
  }

  // -- cold starts: models on their way from a function's upload to a unit ------------------
  function renderColdStarts(s) {
    const uploads = (s.uploading || []).map((u) =>
      el("tr", { className: "upload" }, el("td", {}, u.function || "–"),
        el("td", {}, `${fmt((u.bytes || 0) / 1e6, 1)}` + (u.total ? ` / ${fmt(u.total / 1e6, 1)}` : "") + " MB"),
        el("td", {}, fmt(u.seconds, 1))));
    $("uploads").tBodies[0].replaceChildren(...uploads);
    show("uploads", uploads.length > 0);
    const rows = (s.models || []).map((m) =>
      el("tr", { className: "coldstart", dataset: { digest: m.digest, state: m.state } },
        el("td", { title: m.digest }, el("code", {}, short(m.digest))),
        el("td", { className: "owners" }, m.functions.length ? m.functions.join(", ") : "–"),
        el("td", { className: "state" }, m.state),
        el("td", {}, m.unit || "–"),
        el("td", {}, m.size === null ? "–" : fmt(m.size / 1e6, 1)),
        el("td", {}, m.uploadS === null ? "–" : fmt(m.uploadS, 2)),
        el("td", { className: "load" }, m.loadS === null ? "–" : fmt(m.loadS, 2))));
    $("coldstarts").tBodies[0].replaceChildren(...rows);
    show("coldstarts-empty", rows.length === 0);
  }

  function renderReconfigurations(list) {
    const rows = list.map((r) =>
      el("tr", {}, el("td", {}, r.gpu), el("td", {}, r.from.join(" ")), el("td", {}, r.to.join(" ")),
        el("td", {}, r.status), el("td", {}, r.detail)));
    $("reconfigurations").tBodies[0].replaceChildren(...rows);
    show("reconfigurations-empty", rows.length === 0);
  }

  function renderProcurement(p, cordons) {
    const entries = [];
    if (!p.available) entries.push(["procurer", p.reason]);
    else {
      const nodes = p.nodes.map((n) => `${n.id} (${n.kind}, ${n.state})`).join(", ");
      entries.push(
        ["mode", p.mode],
        ["nodes", `${p.nodes.length} of ${fmt(p.targetNodes, 0)} wanted` + (nodes ? ": " + nodes : "")],
        ["cost so far", p.dollars === null ? "–" : "$" + p.dollars.toFixed(4)],
        ["savings vs on-demand", p.savings === null ? "–" : (p.savings * 100).toFixed(1) + "%"]
      );
    }
    entries.push(["cordoned nodes", cordons.length ? cordons.map((c) => `${c.node} (${c.reason})`).join(", ") : "none"]);
    pairs($("procurement"), entries);
    const rows = (p.events || []).map((e) =>
      el("tr", {}, el("td", { className: "num" }, fmt(e.t, 1)), el("td", {}, e.event), el("td", {}, e.node), el("td", {}, e.detail)));
    $("procurement-events").tBodies[0].replaceChildren(...rows);
    $("procurement-events").hidden = rows.length === 0;
  }

  // -- the refresh loop ---------------------------------------------------------------------
  let refreshes = 0;

  async function refresh() {
    try {
      const r = await fetch(api("/ui/api/status"), { cache: "no-store", credentials: "same-origin" });
      if (!r.ok) throw new Error(`status ${r.status}`);
      const s = await r.json();
      renderFunctions(s.functions);
      renderUnits(s.units);
      renderScheduler(s.scheduler);
      renderColdStarts(s.scheduler);
      renderReconfigurations(s.reconfigurations);
      renderProcurement(s.procurement, s.cordons);
      refreshes += 1;
      const when = new Date(s.generatedAt * 1000).toLocaleTimeString();
      $("updated").textContent = `updated ${when}`;
      $("updated").dataset.refreshes = String(refreshes);
      $("problem").textContent = s.datastore.ok ? "" : "datastore: " + s.datastore.error;
      show("problem", !s.datastore.ok);
    } catch (err) {
      $("problem").textContent = "cannot refresh: " + err.message;
      show("problem", true);
    } finally {
      window.setTimeout(refresh, REFRESH_MS);
    }
  }

  // -- the invoke form ----------------------------------------------------------------------
  let choices = [];

  function updateInvokeChoices(names) {
    if (names.join("\n") === choices.join("\n")) return; // keep what the user picked
    const picked = $("invoke-name").value;
    choices = names;
    $("invoke-name").replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(picked)) $("invoke-name").value = picked;
  }

  async function invoke(event) {
    event.preventDefault();
    const name = $("invoke-name").value;
    if (!name) return;
    const method = $("invoke-method").value;
    const init = { method, headers: {}, credentials: "same-origin" };
    if (method !== "GET") {
      init.body = $("invoke-body").value;
      init.headers["Content-Type"] = $("invoke-type").value || "text/plain";
    }
    $("invoke-status").textContent = "invoking " + name + "…";
    $("invoke-output").textContent = "";
    const t0 = performance.now();
    try {
      const r = await fetch(api("/function/" + encodeURIComponent(name)), init);
      const text = await r.text();
      const ms = (performance.now() - t0).toFixed(0);
      const unit = r.headers.get("X-Faas-Gpu-Unit");
      $("invoke-status").textContent = `${r.status} ${r.statusText} in ${ms} ms` + (unit ? ` on unit ${unit}` : "");
      $("invoke-status").dataset.status = String(r.status);
      $("invoke-output").textContent = text.length > 65536 ? text.slice(0, 65536) + "\n…" : text;
    } catch (err) {
      $("invoke-status").textContent = "failed: " + err.message;
      $("invoke-status").dataset.status = "error";
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("invoke").addEventListener("submit", invoke);
    refresh();
  });
})();
