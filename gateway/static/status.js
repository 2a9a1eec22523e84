// kvgate's status page: reads /kvgate/status every POLL_MS and draws it. No build step, no external assets.
// Every value from the server is put in the page as text (textContent), never as markup: tenant names, model names
// and reasons may come from clients.
"use strict";

const POLL_MS = 2000;
const KEY_STORAGE = "kvgate-admin-key"; // sessionStorage: this browser tab only
const GIB = 1024 ** 3;

const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "class") node.className = value;
    else if (name === "data") Object.assign(node.dataset, value);
    else if (name === "title") node.title = value;
    else throw new Error("unknown property " + name);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const gib = (bytes) => (bytes / GIB).toFixed(2) + " GiB";
const tokens = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
const seconds = (s) => (s < 60 ? s.toFixed(1) + " s" : Math.floor(s / 60) + " min " + Math.round(s % 60) + " s");

function uptime(s) {
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return "up " + (h ? h + " h " : "") + (h || m ? m + " min" : Math.round(s) + " s");
}

// --- one GPU: a stacked bar of weights, KV pools, compute, loads in flight, other processes and free memory ---

function gpuSegments(gpu) {
  const segments = [];
  for (const model of gpu.models || []) {
    if (model.weights_bytes !== null && model.kv_bytes !== null) {
      const rest = Math.max(0, model.resident_bytes - model.weights_bytes - model.kv_bytes);
      segments.push({ kind: "weights", label: "weights " + model.name, bytes: model.weights_bytes });
      segments.push({ kind: "kv", label: "KV pool " + model.name, bytes: model.kv_bytes });
      segments.push({ kind: "compute", label: "compute buffers " + model.name, bytes: rest });
    } else {
      segments.push({ kind: "model", label: model.name + " (weights + KV, " + model.source + ")",
                      bytes: model.resident_bytes });
    }
  }
  segments.push({ kind: "loading", label: "loads in flight", bytes: gpu.reserved_bytes || 0 });
  segments.push({ kind: "other", label: "other processes", bytes: gpu.other_processes_bytes || 0 });
  segments.push({ kind: "free", label: "free", bytes: Math.max(0, gpu.free_bytes || 0) });
  return segments.filter((s) => s.bytes > 0 || s.kind === "free" || s.kind === "other");
}

function stackedBar(segments, scale, label) {
  const bar = el("div", { class: "bar", title: label });
  for (const s of segments) {
    const span = el("span", { class: "seg-" + s.kind, data: { kind: s.kind, bytes: String(s.bytes) },
                              title: s.label + ": " + s.text });
    span.style.width = (scale > 0 ? (100 * s.bytes) / scale : 0) + "%"; // CSSOM: allowed by the CSP
    bar.append(span);
  }
  return bar;
}

function legend(segments) {
  return el("ul", { class: "legend" },
    ...segments.map((s) => el("li", { class: "seg-" + s.kind, data: { kind: s.kind } }, s.label + " " + s.text)));
}

function gpuCard(gpu) {
  const card = el("div", { class: "card gpu", data: { backend: gpu.backend } });
  if (gpu.total_bytes === undefined) {
    card.append(el("h3", {}, gpu.backend), el("p", { class: "problem" }, gpu.problem || "no reading"));
    return card;
  }
  const devices = gpu.devices === 1 ? "1 device" : gpu.devices + " devices";
  card.append(el("h3", {}, gpu.backend + " ",
    el("span", { class: "muted" }, "· " + gpu.source + " · " + devices + " · " + gib(gpu.total_bytes) + " total")));
  const segments = gpuSegments(gpu).map((s) => ({ ...s, text: gib(s.bytes) }));
  const sum = segments.reduce((acc, s) => acc + s.bytes, 0);
  card.append(stackedBar(segments, Math.max(gpu.total_bytes, sum), "GPU memory of " + gpu.backend), legend(segments));
  if (gpu.overcommitted) card.append(el("p", { class: "problem" }, "overcommitted: more is resident or loading than fits"));
  if (gpu.problem) card.append(el("p", { class: "note" }, gpu.problem));
  return card;
}

// --- one KV pool: reserved vs capacity, the sequences holding it, and its requests by outcome ---

// The counts since start, each as <b data-count=NAME>: decisions a request may count in several of, and refusals.
const COUNTS = [["admitted", "admitted"], ["queued", "after a wait"], ["elastic", "elastic"],
  ["ended_by_kvgate", "ended by kvgate (no room to grow)"], ["clamped", "clamped"], ["pinned", "num_ctx pinned"],
  ["context_lowered", "context lowered"], ["trimmed", "trimmed"], ["summarized", "summarized"],
  ["summary_failed", "summaries failed"], ["forwarded_without_pool", "forwarded without a pool"], ["refused", "refused"]];

function counts(totals, skipZero) {
  const parts = [];
  for (const [name, label] of COUNTS) {
    const n = totals[name + "_total"] || 0;
    if (skipZero && !n && name !== "admitted" && name !== "refused") continue;
    if (parts.length) parts.push(" · ");
    parts.push(el("b", { data: { count: name } }, tokens(n)), " " + label);
  }
  const reasons = Object.entries(totals.refused || {});
  if (reasons.length) {
    parts.push(" (", ...reasons.flatMap(([reason, n], i) =>
      [i ? ", " : "", reason + " ", el("b", { data: { refused: reason } }, tokens(n))]), ")");
  }
  return parts;
}

function poolCard(pool) {
  const card = el("div", { class: "card pool", data: { backend: pool.backend, model: pool.model } });
  const layout = pool.kind === null ? "layout unknown" : pool.kind + " · " + pool.layout;
  const shared = pool.scope === "shared";
  card.append(el("h3", {}, pool.backend + " / " + pool.model + " ",
    el("span", { class: "muted", data: { field: "layout" } }, "· " + layout + (shared ? " · shared ledger" : ""))));
  const capacity = pool.capacity_tokens || 0;
  const reserved = pool.reserved_tokens;
  const others = pool.other_replicas || { reserved_tokens: 0, active_sequences: 0, queued: 0 };
  const sequences = pool.sequences || [];
  const segments = sequences.map((s) => ({ kind: "seq", label: "#" + s.id + " " + s.tenant, bytes: s.tokens,
                                           text: tokens(s.tokens) + " tokens" }));
  if (others.reserved_tokens > 0) {
    segments.push({ kind: "others", label: "other replicas (" + others.active_sequences + " sequences)",
                    bytes: others.reserved_tokens, text: tokens(others.reserved_tokens) + " tokens" });
  }
  segments.push({ kind: "free", label: "free", bytes: Math.max(0, capacity - reserved),
                  text: tokens(Math.max(0, capacity - reserved)) + " tokens" });
  card.append(stackedBar(segments, Math.max(capacity, reserved), "KV pool of " + pool.model));
  const here = shared ? [" (", el("b", { data: { field: "reserved-here" } }, tokens(pool.local.reserved_tokens)),
    " by this replica, ", el("b", { data: { field: "reserved-others" } }, tokens(others.reserved_tokens)),
    " by the others)"] : [];
  card.append(el("p", { class: "summary" },
    el("b", { data: { field: "active" } }, String(pool.active_sequences)), " active sequences · ",
    el("b", { data: { field: "reserved" } }, tokens(reserved)), " of " + tokens(pool.capacity_tokens) +
    " tokens reserved", ...here, " · " + pool.queued + " queued" +
    (others.queued ? " here, " + others.queued + " on other replicas" : "")));
  card.append(el("p", { class: "counts", data: { field: "counts" } }, "since start: ", ...counts(pool, true)));
  if (pool.slots_source) {  // where the slot count came from: configured, inferred from /api/ps, /props, assumed
    card.append(el("p", { class: "note", data: { field: "slots-source" } },
      "slots " + pool.slots_source.source + ": " + pool.slots_source.detail));
  }
  const rows = sequences.map((s) => el("tr", {},
    el("td", { class: "num" }, "#" + s.id), el("td", {}, s.tenant), el("td", { class: "num" }, tokens(s.tokens)),
    el("td", { class: "num" }, String(s.sequences)),
    el("td", { class: "num" }, capacity ? ((100 * s.tokens) / capacity).toFixed(1) + " %" : "–")));
  if (rows.length) {
    card.append(el("table", { class: "sequences" },
      el("thead", {}, el("tr", {}, el("th", {}, "reservation"), el("th", {}, "tenant"), el("th", { class: "num" }, "tokens"),
        el("th", { class: "num" }, "sequences"), el("th", { class: "num" }, "of pool"))),
      el("tbody", {}, ...rows)));
  } else {
    card.append(el("p", { class: "empty" }, shared && others.active_sequences ? "no active sequences on this replica"
      : "no active sequences"));
  }
  return card;
}

// --- the queue per tenant, and the recent decisions ---

function queueRows(pools) {
  const rows = [];
  for (const pool of pools) {
    const byTenant = new Map();
    for (const w of pool.waiting || []) {
      if (!byTenant.has(w.tenant)) byTenant.set(w.tenant, []);
      byTenant.get(w.tenant).push(w);
    }
    for (const [tenant, waiters] of byTenant) {
      const oldest = Math.max(...waiters.map((w) => w.waited_s));
      rows.push(el("tr", { data: { tenant } },
        el("td", {}, tenant), el("td", {}, pool.backend + " / " + pool.model),
        el("td", { class: "num", data: { field: "waiting" } }, String(waiters.length)),
        el("td", { class: "num" }, seconds(oldest)),
        el("td", {}, waiters.map((w) => w.position).join(", ")),
        el("td", { class: "num" }, String(waiters[0].priority)),
        el("td", { class: "reason" }, waiters[0].reason)));
    }
  }
  return rows;
}

function decisionRow(d) {
  const time = new Date(d.at_s * 1000).toLocaleTimeString();
  return el("tr", { data: { decision: d.decision } },
    el("td", { class: "nowrap" }, time), el("td", {}, el("span", { class: "decision d-" + d.decision }, d.decision)),
    el("td", {}, d.tenant), el("td", { class: "nowrap" }, d.backend + " / " + d.model), el("td", { class: "num" }, String(d.status)),
    el("td", { class: "num" }, d.reserved_tokens === null ? "" : tokens(d.reserved_tokens)),
    el("td", { class: "reason" }, d.reason), el("td", { class: "muted" }, d.request_id));
}

function fill(tbody, rows, columns, emptyText) {
  tbody.replaceChildren(...(rows.length ? rows
    : [el("tr", {}, Object.assign(el("td", { class: "empty" }, emptyText), { colSpan: columns }))]));
}

function render(status) {
  $("version").textContent = status.version;
  $("uptime").textContent = uptime(status.uptime_s);
  const gpus = status.gpus || [];
  $("gpus").replaceChildren(...(gpus.length ? gpus.map(gpuCard)
    : [el("p", { class: "empty" }, "no backend has a VRAM source (backends.vram)")]));
  const pools = status.pools || [];
  $("pools").replaceChildren(...(pools.length ? pools.map(poolCard) : [el("p", { class: "empty" }, "no KV pool yet")]));
  fill($("queue").tBodies[0], queueRows(pools), 7, "nobody waits");
  fill($("decisions").tBodies[0], (status.recent || []).map(decisionRow), 8, "no decisions yet");
  $("outcomes").replaceChildren("Requests since start: ", ...counts(status.outcomes || {}, false));
  fill($("backends").tBodies[0], (status.backends || []).map((b) => el("tr", {},
    el("td", {}, b.name), el("td", {}, b.kind), el("td", {}, b.url), el("td", {}, b.models.join(", ")),
    routingCell(b.routing),
    el("td", {}, [...(b.last_error ? [b.last_error] : []), ...b.notes].join("; ")))), 6, "no backends");
}

// A backend's routing state: "out for 12.5 s" after it failed (the reason in its title), and its outages so far.
function routingCell(routing) {
  if (!routing) return el("td", {}, "");
  const outages = routing.outages + (routing.outages === 1 ? " outage" : " outages");
  if (routing.out_for_s === null || routing.out_for_s === undefined) {
    return el("td", { class: "nowrap" }, routing.outages ? "in · " + outages : "in");
  }
  return el("td", { class: "nowrap problem", title: routing.out_reason || "" },
    "out for " + routing.out_for_s + " s · " + outages);
}

// --- fetching, the key prompt, and the banner ---

let timer = null;
let inFlight = false; // one reading at a time: a key entered mid-reading waits for the next one

function showBanner(text) {
  $("banner").textContent = text;
  $("banner").hidden = text === null;
}

function askForKey(message) {
  $("key-message").textContent = message;
  $("key-form").hidden = false;
  $("content").hidden = true;
  $("forget").hidden = true;
  $("updated").textContent = "";
  $("key").focus();
}

async function poll() {
  if (inFlight) return;
  inFlight = true;
  clearTimeout(timer);
  timer = null;
  try {
    if (await read()) timer = setTimeout(poll, POLL_MS);
  } finally {
    inFlight = false;
  }
}

// One reading of /kvgate/status; false when polling stops until a key is entered.
async function read() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  const headers = { Accept: "application/json" };
  if (key) headers.Authorization = "Bearer " + key;
  try {
    const response = await fetch("status", { headers, cache: "no-store", credentials: "omit" });
    if (response.status === 403) {
      if (key) sessionStorage.removeItem(KEY_STORAGE);
      showBanner(null);
      askForKey(key ? "kvgate refused that key. Enter the admin key (server.admin_key); it is kept in this browser " +
        "tab only." : "kvgate needs its admin key (server.admin_key) for its status; it is kept in this browser tab " +
        "only and sent to kvgate alone. (With no admin key set, only kvgate's own machine may read it.)");
      return false;
    }
    if (!response.ok) throw new Error("HTTP " + response.status + " from /kvgate/status");
    render(await response.json());
    showBanner(null);
    $("key-form").hidden = true;
    $("content").hidden = false;
    $("forget").hidden = !key;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (error) {
    showBanner("Could not read /kvgate/status: " + error.message + ". Retrying every " + POLL_MS / 1000 + " s; " +
      "the figures below are from the last reading.");
  }
  return true;
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key").value = "";
  $("key-form").hidden = true;
  poll();
});

$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  poll();
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && timer !== null) poll(); // a background tab polls slower (the browser's timer throttling)
});

poll();
