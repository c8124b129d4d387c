// The Cherami web console: plain JS over the public HTTP API (docs/api.md).
// Pages: #/ queues, #/queue/Q, #/queue/Q/group/G (its DLQ), #/cluster.
"use strict";

const REFRESH_MS = 3000;
const HISTORY_MS = 3600 * 1000;
const KEY = "cherami.key";
const main = document.getElementById("main");
const statusEl = document.getElementById("status");

// ---- formatting: as the CLI prints numbers --------------------------------------------
const fmt = {
  int: (n) => (n === null || n === undefined ? "-" : Math.round(n).toLocaleString("en-US")),
  rate: (n) => (n === null || n === undefined ? "-" : `${fmt.short(n)}/s`),
  short: (n) => (Math.abs(n) >= 10 || n === 0 ? Math.round(n).toLocaleString("en-US") : n.toFixed(1)),
  bytes(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "K", "M", "G", "T"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return i === 0 ? `${n}B` : `${n.toFixed(1)}${units[i]}`;
  },
  age(s) {
    if (s === null || s === undefined) return "-";
    if (s < 60) return `${s.toFixed(1)}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
    return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  },
  time: (iso) => (iso ? new Date(iso).toLocaleString("en-GB", { hour12: false }) : "-"),
  secs: (n) => (n === null || n === undefined ? "-" : `${n}s`),
};

// ---- DOM --------------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const num = (v, id) => h("td", { class: "num", "data-col": id }, v);
function table(id, headers, rows, empty) {
  const head = h("tr", {}, headers.map((x) => h("th", { class: x.endsWith(" ") ? "num" : "" }, x.trim())));
  const body = rows.length ? rows : [h("tr", {}, h("td", { class: "empty", colspan: headers.length }, empty))];
  return h("table", { id }, h("thead", {}, head), h("tbody", {}, body));
}
function replace(id, el) {
  const old = document.getElementById(id);
  if (old) old.replaceWith(el);
}
function note(text, error) {
  const el = document.getElementById("note");
  if (!el) return;
  el.replaceChildren(text ? h("div", { class: error ? "note error" : "note" }, text) : "");
}

// ---- the API ----------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}
async function api(method, path, body) {
  const headers = {};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (resp.status === 204) return null;
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = (data && data.error) || {};
    if (resp.status === 401) askForKey(key ? err.message : "");
    throw new ApiError(resp.status, err.code || String(resp.status), err.message || resp.statusText);
  }
  return data;
}
const enc = encodeURIComponent;
const qpath = (q) => `/v1/queues/${enc(q)}`;
const gpath = (q, g) => `${qpath(q)}/groups/${enc(g)}`;
// the stats of what the key covers: a 403 leaves the item out
async function covered(promise) {
  try { return await promise; } catch (e) { if (e.status === 403 || e.status === 404) return null; throw e; }
}

// ---- listings a page at a time (GET /v1/queues, …/groups; docs/api.md "List") ------------
const PAGE = 50;
const NAME_PREFIX = /^[A-Za-z0-9._-]{0,128}$/; // what a name can start with
class Listing {
  constructor(id, path, key, what) {
    Object.assign(this, { id, path, key, what, prefix: "", wanted: PAGE, ticket: 0 });
  }
  // the filter box: each keystroke lists again from the first page
  filter() {
    return h("input", { id: `${this.id}-filter`, type: "search", value: this.prefix, autocomplete: "off",
      placeholder: `filter ${this.what}s by name prefix`, "aria-label": `filter ${this.what}s by name prefix`,
      oninput: (ev) => { this.prefix = ev.target.value.trim(); this.wanted = PAGE; refresh(); } });
  }
  // the first pages, up to what is wanted, each after the cursor of the one before; with a
  // ticket: a read started later (a keystroke, a click on More) makes this one stale
  async read() {
    const ticket = ++this.ticket;
    const items = [];
    let cursor = null;
    if (NAME_PREFIX.test(this.prefix)) {
      do {
        const params = new URLSearchParams({ limit: String(Math.min(this.wanted - items.length, 1000)) });
        if (this.prefix) params.set("prefix", this.prefix);
        if (cursor) params.set("cursor", cursor);
        const page = await api("GET", `${this.path}?${params}`);
        items.push(...page[this.key]);
        cursor = page.cursor;
      } while (cursor && items.length < this.wanted);
    }
    return { items, ticket, more: Boolean(cursor) };
  }
  stale(read) { return read.ticket !== this.ticket; }
  // under the table: how many are shown, and a button for the next page when there is one
  footer(read) {
    if (!read.more) return null;
    return h("p", { class: "more muted" }, `showing the first ${read.items.length} ${this.what}s by name `,
      h("button", { id: `${this.id}-more`, class: "secondary", onclick: () => { this.wanted += PAGE; refresh(); } },
        `Show ${PAGE} more`));
  }
  none(otherwise) {
    return this.prefix ? `No ${this.what} name starts with “${this.prefix}”.` : otherwise;
  }
}
const queueList = new Listing("queues", "/v1/queues", "queues", "queue"); // kept while the tab is open
let groupList = null; // the shown queue's

// ---- rates and history (kept in the page: the last hour, one point per refresh) ----------
const last = new Map(); // key -> {t, v}
function rateOf(key, value) {
  const now = Date.now();
  const prev = last.get(key);
  last.set(key, { t: now, v: value });
  if (!prev || now - prev.t < 500 || value < prev.v) return prev ? prev.rate ?? null : null;
  const rate = ((value - prev.v) * 1000) / (now - prev.t);
  last.get(key).rate = rate;
  return rate;
}
const history = new Map(); // queue -> [{t, rate, backlog}]
function remember(queue, point) {
  const points = history.get(queue) || [];
  points.push({ t: Date.now(), ...point });
  while (points.length && points[0].t < Date.now() - HISTORY_MS) points.shift();
  history.set(queue, points);
  return points;
}

function chart(canvas, points, field, label, format) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, hgt = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = hgt * dpr;
  const c = canvas.getContext("2d");
  c.scale(dpr, dpr);
  c.clearRect(0, 0, w, hgt);
  const pad = { l: 56, r: 10, t: 18, b: 20 };
  const vals = points.map((p) => p[field]).filter((v) => v !== null && v !== undefined);
  const max = Math.max(1, ...vals) * 1.1;
  const now = Date.now(), span = Math.max(60000, now - (points.length ? points[0].t : now));
  const x = (t) => pad.l + ((t - (now - span)) / span) * (w - pad.l - pad.r);
  const y = (v) => hgt - pad.b - (v / max) * (hgt - pad.t - pad.b);
  c.strokeStyle = "#dfe3ea"; c.fillStyle = "#6b7385"; c.font = "11px system-ui, sans-serif";
  for (const f of [0, 0.5, 1]) {
    c.beginPath(); c.moveTo(pad.l, y(max * f / 1.1)); c.lineTo(w - pad.r, y(max * f / 1.1)); c.stroke();
    c.fillText(fmt.short((max * f) / 1.1), 4, y((max * f) / 1.1) + 4);
  }
  c.fillText(label, pad.l, 12);
  c.fillText(`-${Math.round(span / 60000)}m`, pad.l, hgt - 5);
  c.fillText("now", w - pad.r - 22, hgt - 5);
  const drawn = points.filter((p) => p[field] !== null && p[field] !== undefined);
  if (!drawn.length) { c.fillText("collecting…", w / 2 - 30, hgt / 2); return; }
  c.strokeStyle = "#2458c6"; c.lineWidth = 2; c.beginPath();
  drawn.forEach((p, i) => (i ? c.lineTo(x(p.t), y(p[field])) : c.moveTo(x(p.t), y(p[field]))));
  c.stroke();
  c.fillStyle = "#2458c6";
  const tip = drawn[drawn.length - 1];
  c.beginPath(); c.arc(x(tip.t), y(tip[field]), 3, 0, 2 * Math.PI); c.fill();
  c.fillText(format(tip[field]), Math.min(x(tip.t) - 40, w - pad.r - 60), Math.max(12, y(tip[field]) - 8));
}

// ---- the key prompt ---------------------------------------------------------------------
let prompting = false;
function askForKey(message) {
  if (prompting) return;
  prompting = true;
  sessionStorage.removeItem(KEY);
  const input = h("input", { id: "key-input", type: "password", placeholder: "API key", autocomplete: "off" });
  main.replaceChildren(h("div", { class: "card prompt", id: "key-prompt" },
    h("h1", {}, "API key"),
    h("p", { class: "muted" }, "This server requires an API key. The console shows what the key covers; " +
      "the key is kept in this tab only (sessionStorage)."),
    message ? h("p", { class: "note error" }, message) : null,
    h("form", { onsubmit(ev) {
      ev.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      prompting = false;
      route();
    } }, input, h("button", { id: "key-submit", type: "submit" }, "Use key"))));
  input.focus();
}
document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  route();
});

// ---- pages ------------------------------------------------------------------------------
function field(label, attrs) {
  return h("label", {}, label, h("input", attrs));
}
function values(form) {
  const out = {};
  for (const el of form.querySelectorAll("input, select, textarea")) {
    if (!el.name || el.value === "") continue;
    out[el.name] = el.type === "number" ? Number(el.value) : el.value;
  }
  return out;
}
async function act(fn, done, form) {
  try {
    const r = await fn();
    note(done ? done(r) : "");
    if (form) form.reset();
    await refresh();
  } catch (e) { note(`${e.code}: ${e.message}`, true); }
}

const pages = {
  queues: {
    mount() {
      const form = h("form", { class: "inline", id: "new-queue", async onsubmit(ev) {
        ev.preventDefault();
        const { name, ...config } = values(form);
        await act(() => api("PUT", qpath(name), config), () => `queue ${name} created`, form);
      } },
      field("name", { name: "name", id: "new-queue-name", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,127}" }),
      h("label", {}, "type", h("select", { name: "type" }, h("option", {}, "ap"), h("option", {}, "cp"))),
      field("replicas", { name: "replicas", type: "number", min: 1, max: 5, placeholder: "3" }),
      field("retention (s)", { name: "retention_seconds", type: "number", min: 0 }),
      field("delay (s)", { name: "delay_seconds", type: "number", min: 0 }),
      h("button", { id: "new-queue-submit", type: "submit" }, "Create queue"));
      return [h("h1", {}, "Queues"), h("div", { id: "note" }), h("div", { class: "filter" }, queueList.filter()),
        h("div", { id: "queues" }), h("h2", {}, "New queue"), h("div", { class: "card" }, form)];
    },
    async refresh() {
      const read = await queueList.read();
      const queues = read.items;
      const full = (await Promise.all(queues.map((q) => covered(api("GET", qpath(q.name)))))).filter(Boolean);
      if (queueList.stale(read)) return; // a newer read shows its own
      const rows = full.map((q) => {
        const rate = rateOf(`pub:${q.name}`, q.stats.messages_published);
        remember(q.name, { rate });
        return h("tr", { "data-queue": q.name },
          h("td", {}, h("a", { href: `#/queue/${enc(q.name)}` }, q.name)),
          h("td", {}, q.type), num(q.replicas, "replicas"),
          num(fmt.int(q.stats.open_extents), "open"), num(fmt.int(q.stats.sealed_extents), "sealed"),
          num(fmt.bytes(q.stats.bytes_stored), "stored"), num(fmt.int(q.stats.messages_published), "published"),
          num(fmt.rate(rate), "rate"),
          h("td", { class: "actions" }, h("button", { class: "danger", "data-action": "delete", async onclick() {
            if (!confirm(`Delete queue ${q.name}, its groups and all its messages?`)) return;
            await act(() => api("DELETE", qpath(q.name)), () => `queue ${q.name} deleted`);
          } }, "Delete")));
      });
      replace("queues", h("div", { id: "queues" }, table("queues-table",
        ["Name", "Type", "Replicas ", "Open extents ", "Sealed extents ", "Stored ", "Published ", "Publish rate ", ""],
        rows, queues.length ? "Your key covers none of these queues."
          : queueList.none("No queues yet: create one below.")), queueList.footer(read)));
    },
  },

  queue: {
    mount(q) {
      groupList = new Listing("groups", `${qpath(q)}/groups`, "groups", "group");
      peekWanted = PEEK;
      const groupForm = h("form", { class: "inline", id: "new-group", async onsubmit(ev) {
        ev.preventDefault();
        const { name, ...config } = values(groupForm);
        await act(() => api("PUT", gpath(q, name), config), () => `group ${name} created`, groupForm);
      } },
      field("name", { name: "name", id: "new-group-name", required: true }),
      field("visibility timeout (s)", { name: "visibility_timeout_seconds", type: "number", min: 1, placeholder: "60" }),
      field("max deliveries", { name: "max_delivery_count", id: "new-group-max", type: "number", min: 1, placeholder: "10" }),
      h("label", {}, "start from", h("select", { name: "start_from" }, h("option", {}, "earliest"), h("option", {}, "latest"))),
      h("button", { id: "new-group-submit", type: "submit" }, "Create group"));
      const body = h("textarea", { name: "body", id: "publish-body", placeholder: "message body (text)" });
      const publishForm = h("form", { id: "publish", async onsubmit(ev) {
        ev.preventDefault();
        const attrs = {};
        for (const pair of (publishForm.querySelector("[name=attrs]").value || "").split(",")) {
          const [k, ...v] = pair.split("=");
          if (k.trim()) attrs[k.trim()] = v.join("=").trim();
        }
        await act(() => api("POST", `${qpath(q)}/messages`, { messages: [{ body: body.value, attributes: attrs }] }),
          (r) => `published ${r.ids[0]}`, publishForm);
      } }, body, h("div", { class: "inline" },
        h("input", { name: "attrs", placeholder: "attributes: k=v, k2=v2", size: 40 }), " ",
        h("button", { id: "publish-submit", type: "submit" }, "Publish test message")));
      const editForm = h("form", { class: "inline", id: "edit-queue", async onsubmit(ev) {
        ev.preventDefault();
        await act(() => api("PATCH", qpath(q), values(editForm)), () => `queue ${q} updated`, editForm);
      } },
      field("retention (s)", { name: "retention_seconds", type: "number", min: 0 }),
      field("consumed retention (s)", { name: "consumed_retention_seconds", type: "number", min: 0 }),
      field("delay (s)", { name: "delay_seconds", type: "number", min: 0 }),
      field("min extents", { name: "min_extents", type: "number", min: 1 }),
      h("button", { class: "secondary", type: "submit" }, "Save changes"),
      h("button", { class: "danger", id: "delete-queue", type: "button", async onclick() {
        if (!confirm(`Delete queue ${q}, its groups and all its messages?`)) return;
        await act(() => api("DELETE", qpath(q)));
        location.hash = "#/";
      } }, "Delete queue"));
      return [h("p", {}, h("a", { href: "#/" }, "Queues"), " / "), h("h1", {}, q),
        h("div", { id: "queue-config", class: "kv muted" }), h("div", { id: "note" }),
        h("div", { class: "grid" },
          h("div", { class: "card" }, h("canvas", { class: "chart", id: "chart-rate" })),
          h("div", { class: "card" }, h("canvas", { class: "chart", id: "chart-backlog" }))),
        h("h2", {}, "Consumer groups"), h("div", { class: "filter" }, groupList.filter()), h("div", { id: "groups" }),
        h("h2", {}, "Messages"), h("div", { id: "messages" }),
        h("h2", {}, "Scheduled (delayed, not due yet)"), h("div", { id: "scheduled" }),
        h("h2", {}, "Publish a test message"), h("div", { class: "card" }, publishForm),
        h("h2", {}, "New consumer group"), h("div", { class: "card" }, groupForm),
        h("h2", {}, "Extents"), h("div", { id: "extents" }),
        h("h2", {}, "Edit queue"), h("div", { class: "card" }, editForm)];
    },
    async refresh(q) {
      const listing = groupList;
      const [queue, read, extents, peeked, scheduled] = await Promise.all([
        api("GET", qpath(q)), listing.read(), covered(api("GET", `${qpath(q)}/extents`)), covered(newest(q)),
        covered(scheduledOf(q))]);
      const full = await Promise.all(read.items.map((g) => api("GET", gpath(q, g.name))));
      if (listing.stale(read)) return; // a newer read shows its own
      replace("queue-config", h("div", { id: "queue-config", class: "kv muted" },
        ...[["type", queue.type], ["replicas", queue.replicas], ["retention", fmt.secs(queue.retention_seconds)],
          ["delay", fmt.secs(queue.delay_seconds)], ["published", fmt.int(queue.stats.messages_published)],
          ["stored", fmt.bytes(queue.stats.bytes_stored)]].map(([k, v]) => h("span", {}, `${k} `, h("b", {}, v)))));
      let backlog = 0;
      const rows = full.map((g) => {
        const s = g.stats;
        backlog += s.backlog;
        const dlq = s.dlq_depth;
        return h("tr", { "data-group": g.name },
          h("td", {}, g.name, g.type === "stream" ? h("span", { class: "badge" }, " stream") : null),
          num(fmt.int(s.backlog), "backlog"), num(fmt.int(s.in_flight), "in_flight"),
          num(fmt.age(s.oldest_unacked_age_seconds), "oldest"),
          h("td", { class: "num", "data-col": "dlq" }, h("a", { href: `#/queue/${enc(q)}/group/${enc(g.name)}` },
            h("span", { class: dlq ? "badge bad" : "badge" }, fmt.int(dlq)))),
          num(fmt.rate(rateOf(`dlv:${q}/${g.name}`, s.delivered)), "delivery_rate"),
          num(fmt.rate(rateOf(`ack:${q}/${g.name}`, s.acked)), "ack_rate"),
          h("td", { class: "muted" }, `vis ${g.visibility_timeout_seconds}s · max ${g.max_delivery_count}`),
          h("td", { class: "actions" },
            h("button", { class: "secondary", async onclick() {
              const v = prompt(`Visibility timeout (s) of ${g.name}`, g.visibility_timeout_seconds);
              if (v === null) return;
              const m = prompt(`Max delivery count of ${g.name}`, g.max_delivery_count);
              if (m === null) return;
              await act(() => api("PATCH", gpath(q, g.name), { visibility_timeout_seconds: Number(v), max_delivery_count: Number(m) }),
                () => `group ${g.name} updated`);
            } }, "Edit"), " ",
            h("button", { class: "danger", async onclick() {
              if (!confirm(`Delete group ${g.name} and its DLQ?`)) return;
              await act(() => api("DELETE", gpath(q, g.name)), () => `group ${g.name} deleted`);
            } }, "Delete")));
      });
      replace("groups", h("div", { id: "groups" }, table("groups-table",
        ["Group", "Backlog ", "In flight ", "Oldest unacked ", "DLQ ", "Delivery rate ", "Ack rate ", "Settings", ""],
        rows, listing.none("No consumer groups yet.")), listing.footer(read)));
      const points = remember(q, { rate: rateOf(`pub:${q}`, queue.stats.messages_published), backlog });
      chart(document.getElementById("chart-rate"), points, "rate", "publish rate (msgs/s)", fmt.rate);
      chart(document.getElementById("chart-backlog"), points, "backlog", "backlog (messages, all groups)", fmt.int);
      replace("messages", messagesPanel(peeked));
      replace("scheduled", scheduledPanel(q, scheduled));
      const ext = (extents ? extents.extents : []).map((e) => h("tr", { "data-extent": e.id },
        h("td", {}, h("code", {}, e.id.slice(0, 12))), h("td", {}, e.kind),
        h("td", {}, h("span", { class: e.status === "open" ? "badge ok" : e.status === "failing" ? "badge warn" : "badge" }, e.status)),
        h("td", {}, e.input_host || "-"), h("td", {}, (e.stores || []).join(", ") || "-"),
        num(fmt.int(e.last_seq), "messages"), num(fmt.rate(e.rate), "rate")));
      replace("extents", h("div", { id: "extents" }, table("extents-table",
        ["Extent", "Kind", "Status", "Input host", "Store hosts", "Messages ", "Rate "], ext,
        extents ? "No extents." : "Your key does not cover the extents (consume scope).")));
    },
  },

  dlq: {
    mount(q, g) {
      const move = (verb, path) => async () => {
        const { depth } = await api("GET", `${gpath(q, g)}/dlq?limit=1`);
        const what = verb === "merge"
          ? `Merge ${depth} message${depth === 1 ? "" : "s"} from the DLQ back into group ${g}? They are delivered again to this group only.`
          : `Purge ${depth} message${depth === 1 ? "" : "s"} from the DLQ of group ${g}? They are gone for good.`;
        if (!confirm(what)) return;
        await act(() => api("POST", `${gpath(q, g)}/dlq/${path}`), (r) => `${verb}d ${r.merged ?? r.purged} messages`);
      };
      return [h("p", {}, h("a", { href: "#/" }, "Queues"), " / ", h("a", { href: `#/queue/${enc(q)}` }, q), " / "),
        h("h1", {}, `${g}: dead-letter queue`), h("div", { id: "group-stats", class: "kv muted" }), h("div", { id: "note" }),
        h("p", {}, h("button", { id: "dlq-merge", class: "secondary", onclick: move("merge", "merge") }, "Merge back"), " ",
          h("button", { id: "dlq-purge", class: "danger", onclick: move("purge", "purge") }, "Purge")),
        h("div", { id: "dlq" })];
    },
    async refresh(q, g) {
      const [group, dlq] = await Promise.all([api("GET", gpath(q, g)), api("GET", `${gpath(q, g)}/dlq?limit=100`)]);
      const s = group.stats;
      replace("group-stats", h("div", { id: "group-stats", class: "kv muted" },
        ...[["DLQ depth", fmt.int(dlq.depth)], ["backlog", fmt.int(s.backlog)], ["in flight", fmt.int(s.in_flight)],
          ["oldest unacked", fmt.age(s.oldest_unacked_age_seconds)], ["max deliveries", group.max_delivery_count]]
          .map(([k, v]) => h("span", {}, `${k} `, h("b", { "data-stat": k }, v)))));
      const rows = dlq.messages.map((m) => h("tr", { "data-message": m.id },
        h("td", {}, h("code", {}, m.id)), h("td", {}, fmt.time(m.enqueued_at)),
        num(group.max_delivery_count, "deliveries"), ...messageCells(m)));
      replace("dlq", h("div", { id: "dlq" }, table("dlq-table", ["Message", "Dead-lettered at", "Deliveries ", "Attributes", "Body"],
        rows, "The DLQ is empty."), h("p", { class: "muted" }, dlq.depth > rows.length
        ? `showing ${rows.length} of ${fmt.int(dlq.depth)}; ` : "", "a message is dead-lettered after the group's ",
        `max_delivery_count deliveries (now ${group.max_delivery_count}).`)));
    },
  },

  cluster: {
    mount() {
      return [h("h1", {}, "Cluster"), h("div", { id: "note" }), h("div", { id: "hosts" })];
    },
    async refresh() {
      const { hosts } = await api("GET", "/v1/cluster");
      const order = ["frontend", "controller", "inputhost", "outputhost", "storehost"];
      hosts.sort((a, b) => order.indexOf(a.role) - order.indexOf(b.role) || (a.zone || "").localeCompare(b.zone || "") || a.id.localeCompare(b.id));
      const rows = hosts.map((x) => {
        const load = x.load || {};
        const ext = Object.values(load.extents || {});
        return h("tr", { "data-host": x.id },
          h("td", {}, x.role), h("td", {}, x.zone || "-"), h("td", {}, x.id), h("td", {}, x.address),
          h("td", {}, h("span", { class: x.alive ? "badge ok" : "badge bad" }, x.alive ? "alive" : "down")),
          num(x.load ? load.cpu.toFixed(2) : "-", "cpu"), num(x.load ? fmt.int(load.open_extents) : "-", "extents"),
          num(fmt.rate(ext.reduce((a, e) => a + (e.msgs_in || 0), 0)), "in"),
          num(fmt.rate(ext.reduce((a, e) => a + (e.msgs_out || 0), 0)), "out"),
          num(load.connections ?? "-", "conns"), num(load.disk_free_bytes != null ? fmt.bytes(load.disk_free_bytes) : "-", "disk"),
          num(load.append_p99_ms != null ? `${load.append_p99_ms.toFixed(2)}ms` : "-", "p99"),
          num(fmt.age(x.heartbeat_age_seconds), "heartbeat"));
      });
      replace("hosts", h("div", { id: "hosts" }, table("hosts-table",
        ["Role", "Zone", "Host", "Address", "Alive", "CPU ", "Extents ", "In ", "Out ", "Conns ", "Disk free ", "Append p99 ", "Heartbeat "],
        rows, "No hosts.")));
    },
  },
};

// ---- routing and refresh ----------------------------------------------------------------
let current = null;
function parse() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "cluster") return ["cluster", []];
  if (parts[0] === "queue" && parts[2] === "group" && parts[3]) return ["dlq", [parts[1], parts[3]]];
  if (parts[0] === "queue" && parts[1]) return ["queue", [parts[1]]];
  return ["queues", []];
}
async function refresh() {
  if (!current || prompting) return;
  const [name, args] = current;
  try {
    await pages[name].refresh(...args);
    statusEl.textContent = `updated ${new Date().toLocaleTimeString("en-GB", { hour12: false })} · every ${REFRESH_MS / 1000}s`;
  } catch (e) {
    if (e.status === 401) return;
    statusEl.textContent = `refresh failed: ${e.message}`;
    if (e.status === 404) note(`${e.message}`, true);
  }
}
function route() {
  prompting = false;
  const [name, args] = parse();
  current = [name, args];
  document.getElementById("nav-cluster").className = name === "cluster" ? "active" : "";
  document.getElementById("nav-queues").className = name === "cluster" ? "" : "active";
  document.getElementById("signout").hidden = !sessionStorage.getItem(KEY);
  main.replaceChildren(...pages[name].mount(...args));
  document.body.dataset.page = name;
  refresh();
}
window.addEventListener("hashchange", route);
setInterval(refresh, REFRESH_MS);
route();
