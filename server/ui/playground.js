// The rosefast playground: a chat over /v1/chat/completions (streamed), and what the server is doing.
// Text from the model is only ever put into the page as text nodes (textContent): no HTML it writes runs.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "rosefast.conversations";
const SETTINGS = "rosefast.settings";
const KEY = "rosefast.key";          // sessionStorage: asked of the user, never part of the page
const HISTORY_S = 300;               // the chart's window
const POLL_MS = 2000;

let conversations = load(STORE, []);
let current = null;                  // the open conversation
let controller = null;               // the running reply's AbortController
let served = null;                   // the model's id
const history = [];                  // [{t, inflight, tps}] from /metrics
let lastTokens = null;

function load(name, fallback) {
  try { return JSON.parse(localStorage.getItem(name)) ?? fallback; } catch (e) { return fallback; }
}
function save() { localStorage.setItem(STORE, JSON.stringify(conversations)); }

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function status(text) { $("status").textContent = text; }

function askForKey() {
  $("settings").open = true;
  $("api-key").focus();
  status("this server needs its API key: enter it under Settings");
}

// -- markdown, as DOM nodes (never innerHTML) -------------------------------------------------------------

function inline(parent, text) {
  // `code`, **bold**, *emphasis*; everything else a text node
  const pattern = /(`[^`\n]+`|\*\*[^*\n]+\*\*|\*[^*\n]+\*)/g;
  let at = 0;
  for (const m of text.matchAll(pattern)) {
    if (m.index > at) parent.appendChild(document.createTextNode(text.slice(at, m.index)));
    const token = m[0];
    const el = document.createElement(token.startsWith("`") ? "code" : token.startsWith("**") ? "strong" : "em");
    el.textContent = token.replace(/^(`|\*\*|\*)|(`|\*\*|\*)$/g, "");
    parent.appendChild(el);
    at = m.index + token.length;
  }
  if (at < text.length) parent.appendChild(document.createTextNode(text.slice(at)));
}

function renderMarkdown(container, text) {
  container.replaceChildren();
  const parts = text.split(/^```[^\n]*\n?/m);   // even: prose, odd: code (an unclosed fence: code so far)
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      code.textContent = part.replace(/\n$/, "");
      pre.appendChild(code);
      container.appendChild(pre);
      return;
    }
    let list = null;
    for (const block of part.split(/\n{2,}/)) {
      if (!block.trim()) continue;
      for (const line of block.split("\n")) {
        const heading = /^(#{1,6})\s+(.*)$/.exec(line);
        const item = /^\s*(?:[-*]|\d+\.)\s+(.*)$/.exec(line);
        if (item) {
          if (!list) { list = document.createElement("ul"); container.appendChild(list); }
          const li = document.createElement("li");
          inline(li, item[1]);
          list.appendChild(li);
          continue;
        }
        list = null;
        const el = document.createElement(heading ? "h" + Math.min(heading[1].length + 2, 6) : "p");
        inline(el, heading ? heading[2] : line);
        container.appendChild(el);
      }
      list = null;
    }
  });
}

// -- conversations ---------------------------------------------------------------------------------------

function newConversation() {
  current = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
  conversations.unshift(current);
  save();
  showConversations();
  showMessages();
}

function showConversations() {
  const list = $("conversation-list");
  list.replaceChildren();
  for (const c of conversations) {
    const li = document.createElement("li");
    li.className = c === current ? "current" : "";
    const title = document.createElement("span");
    title.textContent = c.title;
    const del = document.createElement("button");
    del.textContent = "×";
    del.title = "delete";
    del.addEventListener("click", (e) => {
      e.stopPropagation();
      conversations = conversations.filter((x) => x !== c);
      save();
      if (c === current) { conversations.length ? open(conversations[0]) : newConversation(); } else showConversations();
    });
    li.append(title, del);
    li.addEventListener("click", () => open(c));
    list.appendChild(li);
  }
}

function open(c) { current = c; showConversations(); showMessages(); }

function messageView(role) {
  const div = document.createElement("div");
  div.className = "message " + role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("div");
  body.className = "body";
  div.append(label, body);
  $("messages").appendChild(div);
  return div;
}

function showMessage(m) {
  const view = messageView(m.role);
  if (m.reasoning) reasoningView(view).textContent = m.reasoning;
  renderMarkdown(view.querySelector(".body"), m.content);
  if (m.stopped) stoppedNote(view);
  return view;
}

function reasoningView(view) {
  let details = view.querySelector("details.reasoning");
  if (!details) {
    details = document.createElement("details");
    details.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "reasoning";
    const text = document.createElement("div");
    details.append(summary, text);
    view.insertBefore(details, view.querySelector(".body"));
  }
  return details.lastChild;
}

function stoppedNote(view) {
  const note = document.createElement("div");
  note.className = "stopped";
  note.textContent = "(stopped)";
  view.appendChild(note);
}

function notice(text) {
  const view = messageView("notice");
  view.querySelector(".body").textContent = text;
  view.scrollIntoView();
}

function showMessages() {
  $("messages").replaceChildren();
  for (const m of current.messages) showMessage(m);
}

// -- settings --------------------------------------------------------------------------------------------

const FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed", "schema"];

function saveSettings() {
  localStorage.setItem(SETTINGS, JSON.stringify(Object.fromEntries(FIELDS.map((f) => [f, $(f).value]))));
}

async function loadModel() {
  const saved = load(SETTINGS, {});
  for (const f of FIELDS) if (saved[f] !== undefined) $(f).value = saved[f];
  const r = await fetch("/v1/models", { headers: headers() });
  if (r.status === 401) { askForKey(); return; }
  if (!r.ok) { status(`/v1/models: ${r.status}`); return; }
  const card = (await r.json()).data[0];
  served = card.id;
  $("model").textContent = `${card.id}` + (card.max_model_len ? ` · context ${card.max_model_len}` : "");
  const defaults = card.generation_defaults || {};
  for (const f of ["temperature", "top_p"]) {
    if (!$(f).value && defaults[f] !== undefined) $(f).value = defaults[f];
    $(f).placeholder = defaults[f] !== undefined ? String(defaults[f]) : "1";
  }
  $("max_tokens").placeholder = "server default";   // left empty, the server's ROSEFAST_DEFAULT_MAX_TOKENS
  status("ready");
}

function requestBody(messages) {
  const body = { model: served || undefined, messages, stream: true, stream_options: { include_usage: true } };
  for (const f of ["temperature", "top_p"]) if ($(f).value !== "") body[f] = Number($(f).value);
  for (const f of ["max_tokens", "seed"]) if ($(f).value !== "") body[f] = parseInt($(f).value, 10);
  const schema = $("schema").value.trim();
  if (schema) {
    body.response_format = { type: "json_schema", json_schema: { name: "playground", schema: JSON.parse(schema), strict: true } };
  }
  return body;
}

// -- a reply ---------------------------------------------------------------------------------------------

function showReplyStats(s) {
  const now = performance.now();
  $("ttft").textContent = s.first === null ? "-" : `${(s.first - s.start).toFixed(0)} ms`;
  $("tokens").textContent = String(s.tokens);
  const gaps = s.gaps.slice().sort((a, b) => a - b);
  $("itl").textContent = gaps.length ? `${gaps[Math.floor(gaps.length / 2)].toFixed(1)} ms` : "-";
  const span = ((s.last ?? now) - (s.first ?? now)) / 1000;
  $("tps").textContent = s.tokens > 1 && span > 0 ? ((s.tokens - 1) / span).toFixed(1) : "-";
}

async function send(text) {
  const user = { role: "user", content: text };
  current.messages.push(user);
  if (current.title === "New chat") { current.title = text.slice(0, 40); showConversations(); }
  save();
  showMessage(user);
  const messages = [];
  if ($("system").value.trim()) messages.push({ role: "system", content: $("system").value });
  for (const m of current.messages) messages.push({ role: m.role, content: m.content });
  let body;
  try { body = requestBody(messages); } catch (e) { notice(`The JSON schema is not JSON: ${e.message}`); return; }
  const reply = { role: "assistant", content: "", reasoning: "" };
  const stats = { start: performance.now(), first: null, last: null, tokens: 0, gaps: [] };
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  let view = null;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                    signal: controller.signal });
    if (!r.ok) {
      const error = await r.json().catch(() => ({}));
      const message = (error.error && error.error.message) || r.statusText;
      if (r.status === 429) {
        notice(`The server is full (429): ${message}. Retry in ${r.headers.get("Retry-After") || "a few"} s.`);
      } else if (r.status === 401) {
        askForKey();
        notice(`401: ${message}`);
      } else {
        notice(`${r.status}: ${message}`);
      }
      current.messages.pop();
      save();
      return;
    }
    view = messageView("assistant");
    const body_ = view.querySelector(".body");
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) { notice(`The request failed: ${chunk.error.message}`); continue; }
        if (chunk.usage) stats.tokens = chunk.usage.completion_tokens;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (!delta) continue;
        const now = performance.now();
        if (delta.content || delta.reasoning_content) {
          if (stats.first === null) stats.first = now; else stats.gaps.push(now - stats.last);
          stats.last = now;
          stats.tokens += 1;   // events until the usage chunk gives the exact count
        }
        if (delta.reasoning_content) {
          reply.reasoning += delta.reasoning_content;
          reasoningView(view).textContent = reply.reasoning;
        }
        if (delta.content) {
          reply.content += delta.content;
          renderMarkdown(body_, reply.content);
        }
        showReplyStats(stats);
        view.scrollIntoView({ block: "end" });
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      reply.stopped = true;
      if (view) stoppedNote(view);
    } else {
      notice(`The request failed: ${e.message}`);
    }
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    showReplyStats(stats);
    if (view) {
      current.messages.push(reply);
      save();
    }
  }
}

// -- the server's numbers --------------------------------------------------------------------------------

function metric(text, name) {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, "m").exec(text);
  return m ? Number(m[1]) : null;
}

async function poll() {
  try {
    const r = await fetch("/metrics");
    if (!r.ok) return;
    const text = await r.text();
    const now = performance.now() / 1000;
    const inflight = metric(text, "rosefast_inflight_requests");
    const tokens = metric(text, "rosefast_completion_tokens_total");
    let tps = null;
    if (lastTokens !== null && tokens !== null && now > lastTokens.t) tps = (tokens - lastTokens.n) / (now - lastTokens.t);
    if (tokens !== null) lastTokens = { t: now, n: tokens };
    $("inflight").textContent = inflight ?? "-";
    $("rejected").textContent = metric(text, "rosefast_rejected_total") ?? "-";
    const used = metric(text, "rosefast_kv_blocks_used");
    const total = metric(text, "rosefast_kv_blocks_total");
    $("kv").textContent = used === null ? "-" : `${used} / ${total}`;
    $("hits").textContent = metric(text, "rosefast_prefix_cache_hits_total") ?? "-";
    $("server-tps").textContent = tps === null ? "-" : tps.toFixed(1);
    history.push({ t: now, inflight: inflight || 0, tps: tps || 0 });
    while (history.length && history[0].t < now - HISTORY_S) history.shift();
    draw(now);
  } catch (e) {
    // the server is restarting or gone: the next poll tries again
  }
}

function draw(now) {
  const canvas = $("chart");
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  for (const [key, color] of [["inflight", "#7a1f3d"], ["tps", "#1f6f7a"]]) {
    const top = Math.max(1, ...history.map((p) => p[key]));
    ctx.strokeStyle = color;
    ctx.beginPath();
    history.forEach((p, i) => {
      const x = w - ((now - p.t) / HISTORY_S) * w;
      const y = h - 4 - (p[key] / top) * (h - 8);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}

// -- wiring ----------------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("new-chat").addEventListener("click", newConversation);
  for (const f of FIELDS) $(f).addEventListener("change", saveSettings);
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem(KEY, $("api-key").value);
    loadModel();
  });
  if (conversations.length) open(conversations[0]); else newConversation();
  loadModel();
  poll();
  setInterval(poll, POLL_MS);
});
