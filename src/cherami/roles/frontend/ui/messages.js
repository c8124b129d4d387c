// The queue page's messages panel: the newest messages, read without consuming them
// (docs/api.md "Peek"). Loaded before console.js, whose helpers (h, api, table, fmt) it
// uses when the queue page draws it.
"use strict";

const PEEK = 20;
let peekWanted = PEEK; // the shown queue's: PEEK more on each click on "Show older"

// the newest peekWanted messages, page after page; null (covered) without consume scope
async function newest(q) {
  const messages = [];
  let cursor = null;
  do {
    const params = new URLSearchParams({ order: "desc", limit: String(Math.min(peekWanted - messages.length, 1000)) });
    if (cursor) params.set("cursor", cursor);
    const page = await api("GET", `${qpath(q)}/messages?${params}`);
    messages.push(...page.messages);
    cursor = page.cursor;
  } while (cursor && messages.length < peekWanted);
  return { messages, more: Boolean(cursor) };
}

// a message's attributes and body, as the DLQ page and this panel show them
function messageCells(m) {
  return [h("td", {}, Object.entries(m.attributes || {}).map(([k, v]) => h("div", {}, h("b", {}, k), `=${v}`))),
    h("td", {}, m.body !== undefined ? h("pre", { class: "body" }, m.body.slice(0, 300))
      : h("span", { class: "muted" }, `(binary, ${Math.floor((m.body_b64.length * 3) / 4)} bytes)`))];
}

function messagesPanel(peeked) {
  const rows = (peeked ? peeked.messages : []).map((m) => h("tr", { "data-peeked": m.id },
    h("td", {}, h("code", {}, m.id)), h("td", {}, fmt.time(m.enqueued_at)), ...messageCells(m)));
  const empty = peeked ? "No messages (delayed ones are not shown)." : "Your key does not cover reading messages (consume scope).";
  const more = peeked && peeked.more
    ? [" · ", h("button", { id: "messages-more", class: "secondary", onclick: () => { peekWanted += PEEK; refresh(); } },
      `Show ${PEEK} older`)]
    : null;
  return h("div", { id: "messages" }, table("messages-table", ["Message", "Enqueued at", "Attributes", "Body"], rows, empty),
    h("p", { class: "muted" }, "the newest first, read without consuming them (no group sees a change)", more));
}

// the queue page's scheduled panel: delayed messages not due yet, the first due first,
// each with a Cancel button (docs/api.md "Scheduled messages")
async function scheduledOf(q) {
  return api("GET", `${qpath(q)}/scheduled?limit=${PEEK}`);
}

function scheduledPanel(q, page) {
  const rows = (page ? page.messages : []).map((m) => h("tr", { "data-scheduled": m.id },
    h("td", {}, h("code", {}, m.id)), h("td", {}, fmt.time(m.due_at)), ...messageCells(m),
    h("td", { class: "actions" }, h("button", { class: "danger", async onclick() {
      if (!confirm(`Cancel message ${m.id}? No group will receive it.`)) return;
      await act(() => api("DELETE", `${qpath(q)}/scheduled/${enc(m.id)}`), () => `message ${m.id} cancelled`);
    } }, "Cancel"))));
  const empty = page ? "No delayed message is waiting." : "Your key does not cover reading messages (consume scope).";
  return h("div", { id: "scheduled" },
    table("scheduled-table", ["Message", "Due at", "Attributes", "Body", ""], rows, empty),
    h("p", { class: "muted" }, page && page.cursor ? `the first ${PEEK} due; more are waiting` : "the first due first"));
}
