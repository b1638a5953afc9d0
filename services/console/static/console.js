// loopwire console: plain JS, no dependencies. Data comes from /api (JSON) and server-sent events
// read with fetch (so the token header goes along); a dropped event stream reconnects with
// Last-Event-ID = the last committed stream sequence, and the server resumes right after it.
"use strict";

const LW = {
  token: sessionStorage.getItem("lw-token") || "",
  repeats: 0,
};
window.lwRepeats = 0;
window.lwSeqs = [];

// --- small helpers ----------------------------------------------------------------------------

// A scripted model by its file's name, as the console's summaries name it (shared/modelspec.py).
function modelId(spec) {
  return spec && spec.startsWith("scripted:") ? "scripted:" + spec.slice(9).split("/").pop() : spec;
}

function $(sel, root) { return (root || document).querySelector(sel); }
function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") n.className = v;
    else if (k === "text") n.textContent = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) n.append(c.nodeType ? c : String(c));
  return n;
}
function uuid4() {
  // crypto.randomUUID needs a secure context; getRandomValues works on plain http too.
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40; b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
function when(ts) { return ts ? ts.replace("T", " ").replace(/\.\d+Z$/, "Z") : ""; }
function short(id) { return (id || "").slice(0, 8); }
function textOf(msg) {
  return (msg && msg.blocks ? msg.blocks : []).filter((b) => b.type === "text" || b.type === "refusal")
    .map((b) => b.text).join("");
}
function stateBadge(state) { return el("span", { class: `state state-${state}`, text: state }); }
function operator() { return ($("#operator") && $("#operator").value.trim()) || "console"; }
function throttle(fn, ms) {
  let timer = null, again = false;
  return function run() {
    if (timer) { again = true; return; }
    fn();
    timer = setTimeout(() => { timer = null; if (again) { again = false; run(); } }, ms);
  };
}

// --- API ------------------------------------------------------------------------------------

function headers(extra) {
  const h = Object.assign({ Accept: "application/json" }, extra || {});
  if (LW.token) h["X-Loopwire-Token"] = LW.token;
  return h;
}
async function api(path, body) {
  const opts = { headers: headers(), credentials: "same-origin" };
  if (body !== undefined) {
    opts.method = "POST";
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  let resp;
  try { resp = await fetch(path, opts); } catch (e) {
    return { ok: false, error: { kind: "unavailable", message: `the console did not answer (${e.message})` } };
  }
  let doc;
  try { doc = await resp.json(); } catch (e) {
    doc = { ok: false, error: { kind: "internal", message: `unreadable answer (HTTP ${resp.status})` } };
  }
  if (resp.status === 401) askToken(doc.error && doc.error.message);
  return doc;
}
function askToken(why) {
  const bar = $("#token-bar");
  if (!bar) return;
  $("#token-why").textContent = why || "This console needs its token.";
  bar.hidden = false;
}
function flash(node, doc, okText) {
  if (!node) return;
  node.textContent = doc.ok ? okText : doc.error.message;
  node.className = `flash ${doc.ok ? "ok" : "error"}`;
}

// A server-sent event stream read with fetch: reconnects after a drop, sending Last-Event-ID.
function eventStream(url, onEvent, onState) {
  let lastId = null, stopped = false;
  async function run() {
    while (!stopped) {
      try {
        const h = headers({ Accept: "text/event-stream" });
        if (lastId !== null) h["Last-Event-ID"] = lastId;
        const resp = await fetch(url, { headers: h, cache: "no-store" });
        if (resp.status === 401) { askToken(); onState(false); await sleep(2000); continue; }
        if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
        onState(true);
        const reader = resp.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, i); buf = buf.slice(i + 2);
            let type = "message", data = "", id = null;
            for (const line of block.split("\n")) {
              if (line.startsWith("id: ")) id = line.slice(4);
              else if (line.startsWith("event: ")) type = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
            }
            if (!data) continue;
            if (id !== null) lastId = id;
            onEvent(type, JSON.parse(data));
          }
        }
      } catch (e) { /* dropped: reconnect below */ }
      onState(false);
      if (!stopped) await sleep(500);
    }
  }
  run();
  return { stop() { stopped = true; }, get lastId() { return lastId; } };
}
function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }
function connState(up) {
  const c = $("#conn");
  if (!c) return;
  c.textContent = up ? "live" : "reconnecting…";
  c.className = `conn ${up ? "" : "down"}`;
  document.body.dataset.live = up ? "1" : "0";
}

// The gate count in the navigation (and the caller's refresh) follows the index.
function followIndex(onChange) {
  return eventStream("/api/stream", (type, data) => {
    if (type !== "changed") return;
    const b = $("#gate-count");
    if (b) { b.textContent = String(data.gates); b.className = `badge${data.gates ? "" : " zero"}`; }
    // A parked loop is visible from any tab: the title counts the open gates.
    document.title = `${data.gates ? `(${data.gates}) ` : ""}${document.title.replace(/^\(\d+\) /, "")}`;
    if (onChange) onChange(data);
  }, connState);
}

// --- gates (loop page and inbox) --------------------------------------------------------------

function gateCard(g, opts) {
  const card = el("div", { class: "card gate-card", "data-gate": g.gate_id });
  // (a budget gate's tool_name names the spent limit: approve grants it again, deny fails the turn)
  const title = g.kind === "user_input" ? "Question"
    : g.kind === "budget" ? `Budget spent (${g.tool_name}): go on?` : `May ${g.tool_name} run?`;
  card.append(el("div", { class: "row" }, el("strong", { text: title }),
    el("span", { class: "muted", text: `opened ${when(g.opened_at)}` }),
    opts && opts.withLoop ? el("a", { href: `/loops/${g.loop_id}`, class: "mono", text: `loop ${short(g.loop_id)}` }) : null,
    // A sub-agent's gate: answered here, it goes to the child loop.
    g.child_of ? el("span", { class: "muted" }, "sub-agent ", el("a", { href: `/loops/${g.loop_id}`, class: "mono", text: short(g.loop_id) }),
      " of ", el("a", { href: `/loops/${g.child_of}`, class: "mono", text: short(g.child_of) })) : null));
  if (g.text) card.append(el("div", { class: "text mono", text: g.text }));
  const result = el("div", { class: "result-msg" });
  const controls = g.controls && g.controls.length ? g.controls : ["approve", "approve_always", "deny"];
  const row = el("div", { class: "row" });
  const send = async (action, extra) => {
    row.querySelectorAll("button").forEach((b) => { b.disabled = true; });
    card.dataset.answer = "pending";
    const doc = await api(`/api/loops/${g.loop_id}/answer`, Object.assign({
      command_id: uuid4(), gate_id: g.gate_id, action, operator: operator() }, extra || {}));
    result.textContent = doc.ok ? `answered: ${action}` : doc.error.message;
    result.className = `result-msg ${doc.ok ? "ok" : "error"}`;
    card.dataset.answer = doc.ok ? "ok" : (doc.error.kind || "error");
    if (!doc.ok && doc.error.kind !== "already_answered") {
      row.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    }
  };
  if (controls.includes("approve")) row.append(el("button", { class: "primary approve", type: "button", text: "Approve", onclick: () => send("approve") }));
  if (controls.includes("approve_always")) row.append(el("button", { class: "approve-always", type: "button", text: "Approve always", onclick: () => send("approve_always") }));
  if (controls.includes("deny")) {
    const reason = el("input", { class: "deny-reason", placeholder: "reason (shown to the model)", size: "24" });
    row.append(reason, el("button", { class: "danger deny", type: "button", text: "Deny", onclick: () => send("deny", { reason: reason.value }) }));
  }
  if (controls.includes("reply")) {
    for (const c of g.choices || []) row.append(el("button", { type: "button", class: "choice", text: c, onclick: () => send("reply", { text: c }) }));
    const answer = el("input", { class: "reply-text", placeholder: "your answer", size: "30" });
    row.append(answer, el("button", { class: "primary reply", type: "button", text: "Reply", onclick: () => {
      if (!answer.value.trim()) { result.textContent = "write an answer first"; result.className = "result-msg error"; return; }
      send("reply", { text: answer.value });
    } }));
  }
  card.append(row, result);
  return card;
}

// A card whose gate closes stays, saying who answered it and when (never vanishing under the operator).
function syncGates(container, gates, opts, resolved) {
  const want = new Set(gates.map((g) => g.gate_id));
  const done = new Map((resolved || []).map((g) => [g.gate_id, g]));
  for (const card of Array.from(container.children)) {
    if (want.has(card.dataset.gate) || card.dataset.answer) continue;
    const g = done.get(card.dataset.gate);
    card.querySelectorAll("button, input").forEach((b) => { b.disabled = true; });
    const msg = card.querySelector(".result-msg");
    msg.textContent = g ? g.note : "no longer open (its turn ended)";
    msg.className = "result-msg error";
    card.dataset.answer = g && g.action !== "abandoned" ? "already_answered" : "closed";
    setTimeout(() => card.remove(), 60000);
  }
  const have = new Set(Array.from(container.children).map((c) => c.dataset.gate));
  gates.forEach((g) => { if (!have.has(g.gate_id)) container.append(gateCard(g, opts)); });
}

// --- budgets ---------------------------------------------------------------------------------

// A cost in USD, to the micro-dollar the history records (docs/budgets.md).
function usd(x) { return `$${(x || 0).toFixed(6)}`; }

// A loop's budget as set at its start or by its latest BudgetChanged (0 = unlimited).
function budgetText(b) {
  const parts = [];
  if (b.max_total_tokens) parts.push(`${b.max_total_tokens} tokens`);
  if (b.max_cost_usd) parts.push(usd(b.max_cost_usd));
  if (b.max_steps_per_turn) parts.push(`${b.max_steps_per_turn} steps/turn`);
  if (b.max_turn_seconds) parts.push(`${b.max_turn_seconds} s/turn`);
  return parts.length ? `${parts.join(", ")} · on budget: ${b.on_budget || "fail"}` : "unlimited";
}

// --- loops page -----------------------------------------------------------------------------

function loopsPage() {
  let page = 1;
  const load = throttle(async () => {
    const q = new URLSearchParams({ page: String(page), state: $("#f-state").value, q: $("#f-text").value });
    const doc = await api(`/api/loops?${q}`);
    if (!doc.ok) { $("#page-info").textContent = doc.error.message; return; }
    page = doc.page;
    const body = $("#loops tbody");
    body.replaceChildren(...doc.loops.map((s) => el("tr", { "data-loop": s.loop_id },
      el("td", {}, el("a", { class: "mono", href: `/loops/${s.loop_id}`, text: short(s.loop_id) })),
      el("td", {}, stateBadge(s.state)),
      el("td", { class: "mono", text: s.model }),
      el("td", { class: "num", text: String(s.turns) }),
      el("td", { text: when(s.last_activity) }),
      el("td", { class: "num", text: String(s.tokens) }),
      el("td", { class: "num", text: usd(s.cost_usd) }),
      el("td", { text: s.title }))));
    $("#page-info").textContent = `page ${doc.page} of ${doc.pages} · ${doc.total} loop(s)`;
    $("#prev").disabled = doc.page <= 1;
    $("#next").disabled = doc.page >= doc.pages;
    $("#counts").textContent = Object.entries(doc.counts).map(([k, v]) => `${k} ${v}`).join(" · ");
    if (!document.body.dataset.ready) { window.lwFirstRender = performance.now(); document.body.dataset.ready = "1"; }
  }, 300);
  $("#f-state").addEventListener("change", () => { page = 1; load(); });
  $("#f-text").addEventListener("input", () => { page = 1; load(); });
  $("#prev").addEventListener("click", () => { page -= 1; load(); });
  $("#next").addEventListener("click", () => { page += 1; load(); });
  $("#start").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const body = { command_id: uuid4() };
    for (const [k, v] of f.entries()) if (String(v).trim()) body[k] = String(v);
    $("#s-go").disabled = true;
    const doc = await api("/api/loops", body);
    $("#s-go").disabled = false;
    flash($("#start-flash"), doc, "started");
    if (doc.ok) location.href = `/loops/${doc.loop_id}`;
  });
  load();
  followIndex(load);
}

// --- gates page -----------------------------------------------------------------------------

function gatesPage() {
  const load = throttle(async () => {
    const doc = await api("/api/gates");
    if (!doc.ok) return;
    syncGates($("#gates"), doc.gates, { withLoop: true }, doc.resolved);
    $("#no-gates").hidden = doc.gates.length > 0;
  }, 250);
  load();
  followIndex(load);
}

// --- tools page -----------------------------------------------------------------------------

function argsOf(schema) {
  const props = (schema && schema.properties) || {};
  const req = new Set((schema && schema.required) || []);
  return Object.entries(props).map(([k, v]) => `${k}${req.has(k) ? "" : "?"}: ${v && v.enum ? v.enum.join("|") : (v && v.type) || "any"}`).join(", ");
}
// The safety annotations, as `loopwire tools` shows them ("-": unannotated, may have any side effect).
function safetyOf(t) {
  const marks = [["read-only", t.read_only], ["idempotent", t.idempotent], ["destructive", t.destructive], ["open-world", t.open_world]];
  return marks.filter(([, on]) => on).map(([label]) => label).join(", ") || "-";
}
function toolsPage() {
  const load = async () => {
    const doc = await api("/api/tools");
    if (!doc.ok) return;
    $("#tools tbody").replaceChildren(...doc.tools.map((t) => el("tr", { "data-tool": t.name },
      el("td", { class: "mono", text: t.name }), el("td", { class: "num", text: String(t.replicas) }),
      el("td", { text: t.kind }), el("td", { text: t.version }), el("td", { class: "safety", text: safetyOf(t) }),
      el("td", {}, el("details", {}, el("summary", { class: "mono", text: argsOf(t.input_schema) || "(none)" }),
        el("pre", { class: "result", text: JSON.stringify(t.input_schema, null, 2) }))),
      el("td", { text: t.description }))));
    $("#conflicts").replaceChildren(...Object.entries(doc.conflicts).map(([name, specs]) =>
      el("p", { class: "error", text: `${name}: replicas disagree (${specs.map((s) => s.version).join(", ")}); not offered to models` })));
  };
  load();
  setInterval(load, 3000);
  followIndex(null);
}

// --- loop page --------------------------------------------------------------------------------

function resultText(msg) {
  return (msg.blocks || []).map((b) => b.type === "text" ? b.text : JSON.stringify(b)).join("");
}

function renderEvent(rec, loopId) {
  const e = rec.event, t = e.type;
  let cls = "ev", body = [];
  const head = el("div", { class: "head" }, el("span", { class: "type", text: t }),
    el("span", { class: "mono", text: `#${rec.seq}` }), el("span", { text: when(e.created_at) }));
  if (t === "LoopStarted") {
    cls += " quiet";
    const pol = Object.entries(e.policy || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    body.push(el("div", { text: `model ${modelId(e.model) || "(default)"} · tools ${e.tools ? (e.tools.join(", ") || "none") : "all live"} · default policy ${e.default_policy || "allow"}${pol ? ` · policy ${pol}` : ""}` }));
    if (e.system) body.push(el("div", { class: "text muted", text: e.system }));
  } else if (t === "InputSubmitted") {
    cls += " user"; body.push(el("div", { class: "text", text: textOf(e.message) }));
  } else if (t === "TurnStarted" || t === "TurnFoldedInto") {
    cls += " quiet"; body.push(el("div", { text: `turn ${e.turn_index}${t === "TurnFoldedInto" ? " (input folded in)" : " started"}` }));
  } else if (t === "StepDone") {
    cls += " assistant";
    const results = {};
    for (const m of e.messages.slice(1)) if (m.role === "tool") results[m.tool_use_id] = m;
    const ai = e.messages[0] || {};
    const text = textOf(ai);
    if (text) body.push(el("div", { class: "text assistant-text", text }));
    for (const b of ai.blocks || []) {
      if (b.type !== "tool_use") continue;
      const r = results[b.id];
      const status = r ? (r.is_error ? "error" : "ok") : "no result";
      body.push(el("details", { class: "tool", "data-tool": b.name },
        el("summary", {}, el("span", { class: "mono", text: `${b.name} ${JSON.stringify(b.input)}` }), ` → ${status}`),
        el("div", { class: "muted", text: "input" }), el("pre", { text: JSON.stringify(b.input, null, 2) }),
        el("div", { class: "muted", text: "result" }),
        el("pre", { class: `result${r && r.is_error ? " err" : ""}`, text: r ? resultText(r) : "" })));
    }
    if (ai.usage) body.push(el("div", { class: "muted", text: `tokens in ${ai.usage.input_tokens || 0}, out ${ai.usage.output_tokens || 0}` }));
  } else if (t === "TurnDone") {
    cls += " quiet";
    const u = e.usage ? ` · tokens in ${e.usage.input_tokens || 0}, out ${e.usage.output_tokens || 0}` : "";
    body.push(el("div", { class: "ok", text: `turn ${e.turn_index} done${u}` }));
  } else if (t === "TurnFailed") {
    cls += " bad"; body.push(el("div", { class: "error", text: `turn ${e.turn_index} failed: ${e.err.kind}: ${e.err.message || ""}` }));
  } else if (t === "TurnInterrupted") {
    cls += " bad"; body.push(el("div", { text: `turn ${e.turn_index} interrupted (${e.reason})` }));
  } else if (t === "PermissionRequested") {
    cls += " gate"; body.push(el("div", { class: "mono", text: `may ${e.request.tool_name} run? ${e.request.summary}` }));
  } else if (t === "UserInputRequested") {
    cls += " gate"; body.push(el("div", { text: `question: ${e.question}${e.choices && e.choices.length ? ` [${e.choices.join(", ")}]` : ""}` }));
  } else if (t === "GateOpened") {
    cls += " gate"; body.push(el("div", { text: `gate ${short(e.gate.id)} opened (${e.gate.kind}${e.gate.tool_name ? ` ${e.gate.tool_name}` : ""})` }));
  } else if (t === "GateResolved") {
    cls += " gate";
    const extra = e.reason || e.text;
    body.push(el("div", { text: `gate ${short(e.gate_id)}: ${e.action}${e.resolver ? ` by ${e.resolver}` : ""}${extra ? `: ${extra}` : ""}` }));
  } else if (t === "PermissionDecided") {
    cls += " quiet"; body.push(el("div", { text: `${e.tool_name}: ${e.effect} (${e.reason})` }));
  } else if (t === "ContextCompacted") {
    cls += " quiet";
    body.push(el("div", { text: `context compacted: messages 1-${e.upto} summarised by ${modelId(e.model) || "the loop's model"}, ${e.tokens_before || 0} → ${e.tokens_after || 0} tokens` }));
    body.push(el("details", {}, el("summary", { text: "summary" }), el("pre", { class: "result", text: e.summary })));
  } else if (t === "BudgetChanged") {
    cls += " quiet";
    const limits = Object.entries(e.budget || {}).map(([k, v]) => `${k} ${v}`).join(", ");
    body.push(el("div", { text: `budget changed: ${limits || "unlimited"}` }));
  } else if (t === "LoopIdle") {
    cls += " quiet";
  } else if (t === "LoopClosed") {
    cls += " bad"; body.push(el("div", { text: "loop closed" }));
  }
  const node = el("div", { class: `${cls} ev-${t}`, "data-seq": String(rec.seq), "data-type": t }, head, ...body);
  if (rec.cut) {
    node.append(el("button", { type: "button", class: "expand", text: "show everything", onclick: async () => {
      const doc = await api(`/api/loops/${loopId}/events/${rec.seq}`);
      if (doc.ok) node.replaceWith(renderEvent({ seq: rec.seq, event: doc.event, cut: false }, loopId));
    } }));
  }
  return node;
}

function loopPage() {
  const loopId = location.pathname.split("/").pop();
  $("#loop-id").textContent = loopId;
  document.title = `Loop ${short(loopId)} · loopwire console`;
  const timeline = $("#timeline");
  let firstSeq = 0, lastSeq = 0, more = false, loadingEarlier = false;
  const liveBox = $("#live"), liveText = $("#live-text"), liveTools = $("#live-tools");
  const toolRows = {};

  function clearLive() {
    liveText.textContent = ""; liveTools.replaceChildren();
    for (const k of Object.keys(toolRows)) delete toolRows[k];
    liveBox.hidden = true;
  }
  function append(rec) {
    if (rec.seq <= lastSeq) { LW.repeats += 1; window.lwRepeats = LW.repeats; return; }
    lastSeq = rec.seq;
    window.lwSeqs.push(rec.seq);
    timeline.append(renderEvent(rec, loopId));
    const t = rec.event.type;
    if (t === "StepDone" || t === "TurnDone" || t === "TurnFailed" || t === "TurnInterrupted" || t === "LoopClosed") clearLive();
  }
  // An agent call's progress names its child loop first: the row links to it and lists what the
  // child does (its last few steps and tool calls) nested under the call.
  function showProgress(row, message) {
    const child = /^child loop ([0-9a-f-]{36})/.exec(message || "");
    if (child) row.dataset.child = child[1];
    if (!row.dataset.child) { row.textContent = `▶ ${row.dataset.summary || "tool call"} … ${message}`; return; }
    const lines = (row.dataset.lines ? JSON.parse(row.dataset.lines) : []).concat(child ? [] : [message]).slice(-5);
    row.dataset.lines = JSON.stringify(lines);
    row.replaceChildren(
      el("div", {}, `▶ ${row.dataset.summary || "sub-agent"} … `,
        el("a", { class: "mono", href: `/loops/${row.dataset.child}`, text: `child loop ${short(row.dataset.child)}` })),
      el("div", { class: "child-progress" }, ...lines.map((l) => el("div", { class: "mono muted", text: `  ${l}` }))));
  }
  function onLive(e) {
    const t = e.type;
    if (t === "TokenDelta") {
      const c = e.chunk || {};
      if (c.kind === "text" || c.kind === "refusal" || c.kind === undefined) liveText.textContent += c.text || "";
      else if (c.kind === "tool_use" && c.name) liveText.textContent += `\n→ ${c.name} `;
    } else if (t === "ToolCallStarted" || t === "ToolCallProgress" || t === "ToolCallCompleted") {
      // Rows are keyed by execution id: a page opened mid-call shows it from its next heartbeat.
      const key = e.tool_execution_id || e.tool_use_id;
      let row = toolRows[key];
      if (!row) {
        row = el("div", { class: "tool-row", "data-exec": key, text: "▶ running tool call …" });
        toolRows[key] = row; liveTools.append(row);
      }
      if (t === "ToolCallStarted") { row.dataset.summary = e.summary || e.tool_name; row.textContent = `▶ ${row.dataset.summary} …`; }
      else if (t === "ToolCallProgress") showProgress(row, e.message);
      else row.textContent = `${e.is_error ? "✗" : "✓"} ${row.dataset.summary || e.tool_use_id} ${e.is_error ? "error" : "ok"} in ${e.duration_ms} ms: ${e.result_preview}`;
    } else return;
    liveBox.hidden = false;
  }
  const refresh = throttle(async () => {
    const doc = await api(`/api/loops/${loopId}`);
    if (!doc.ok) return;
    const s = doc.loop;
    $("#loop-state").replaceWith(Object.assign(stateBadge(s.state), { id: "loop-state" }));
    $("#f-model").textContent = s.model; $("#f-turns").textContent = String(s.turns);
    $("#f-tokens").textContent = `${s.tokens} (in ${s.input_tokens}, out ${s.output_tokens})`;
    $("#f-cost").textContent = usd(s.cost_usd);
    $("#f-budget").textContent = budgetText(s.budget);
    $("#f-events").textContent = String(s.events); $("#f-activity").textContent = when(s.last_activity);
    $("#f-error").textContent = s.state === "failed" ? s.last_error : "";
    syncGates($("#loop-gates"), s.open_gates, {}, s.resolved_gates);
    document.body.dataset.state = s.state;
  }, 200);

  async function loadEarlier() {
    if (!more || loadingEarlier) return;
    loadingEarlier = true;
    const doc = await api(`/api/loops/${loopId}/events?before=${firstSeq}`);
    loadingEarlier = false;
    if (!doc.ok) return;
    const keep = document.documentElement.scrollHeight - window.scrollY;
    const frag = document.createDocumentFragment();
    for (const rec of doc.events) frag.append(renderEvent(rec, loopId));
    timeline.prepend(frag);
    window.lwSeqs = doc.events.map((r) => r.seq).concat(window.lwSeqs);
    if (doc.events.length) firstSeq = doc.events[0].seq;
    more = doc.more; $("#earlier").hidden = !more;
    window.scrollTo(0, document.documentElement.scrollHeight - keep);
  }
  $("#earlier").addEventListener("click", loadEarlier);
  new IntersectionObserver((entries) => { if (entries.some((x) => x.isIntersecting)) loadEarlier(); })
    .observe($("#earlier"));

  async function start() {
    const doc = await api(`/api/loops/${loopId}/events`);
    if (!doc.ok) { timeline.append(el("p", { class: "error", text: doc.error.message })); return; }
    const frag = document.createDocumentFragment();
    for (const rec of doc.events) { frag.append(renderEvent(rec, loopId)); window.lwSeqs.push(rec.seq); }
    timeline.append(frag);
    if (doc.events.length) { firstSeq = doc.events[0].seq; lastSeq = doc.events[doc.events.length - 1].seq; }
    more = doc.more; $("#earlier").hidden = !more;
    window.lwFirstRender = performance.now();
    document.body.dataset.ready = "1";
    $("#loop-end").scrollIntoView();
    refresh();
    eventStream(`/api/loops/${loopId}/stream?after=${lastSeq}`, (type, data) => {
      if (type === "commit") { append(data); refresh(); lineageLater(); }
      else if (type === "live") onLive(data);
    }, connState);
  }
  const lineageLater = throttle(() => showLineage(), 1000);
  start().then(showLineage).then(showVerified);

  // The verified mark: the history as stored, checked on load against its digest chain by the server.
  async function showVerified() {
    const doc = await api(`/api/loops/${loopId}/verify`);
    const mark = $("#loop-verified");
    if (!doc.ok) { mark.textContent = "? not verified"; mark.title = doc.error.message; mark.className = "verified unknown"; }
    else if (doc.verified) {
      mark.textContent = `✓ verified (${doc.chained} of ${doc.records} records chained)`;
      mark.title = "every record matches its digest and follows the one before it";
      mark.className = "verified ok";
    } else {
      mark.textContent = `✗ ${doc.problems.length} problem(s) in the stored history`;
      mark.title = doc.problems.map((p) => `${p.problem} seq ${p.seq || "-"}: ${p.detail}`).join("\n");
      mark.className = "verified bad";
    }
    mark.dataset.verified = doc.ok ? String(doc.verified) : "unknown";
    mark.hidden = false;
  }
  followIndex(null);

  // Forks: "fork from here" on every valid point, and where this loop comes from and went.
  async function showLineage() {
    const doc = await api(`/api/loops/${loopId}/lineage`);
    if (!doc.ok) return;
    const points = new Set(doc.points);
    window.lwForkPoints = doc.points;
    for (const node of timeline.querySelectorAll(".ev")) {
      const seq = Number(node.dataset.seq);
      const button = node.querySelector(".fork");
      // A point stops being valid when the loop moves on (a turn's answer, once its TurnDone follows).
      if (points.has(seq)) { if (!button) node.append(forkButton(seq, node)); }
      else if (button) button.remove();
    }
    const rows = [];
    if (doc.parent) rows.push(el("div", {}, "forked from ", el("a", { class: "mono", href: `/loops/${doc.parent}`, text: short(doc.parent) }), ` at #${doc.forked_at}`));
    if (doc.agent_parent) rows.push(el("div", {}, `sub-agent ${doc.agent_tool || ""} of `, el("a", { class: "mono", href: `/loops/${doc.agent_parent}`, text: short(doc.agent_parent) })));
    for (const c of doc.children) {
      if (c.link === "child") rows.push(el("div", { class: "child" }, `sub-agent ${c.tool} `, el("a", { class: "mono", href: `/loops/${c.loop_id}`, text: short(c.loop_id) }), ` (call ${short(c.call)}) · ${c.state}`));
      else rows.push(el("div", { class: "child" }, "fork ", el("a", { class: "mono", href: `/loops/${c.loop_id}`, text: short(c.loop_id) }), ` at #${c.at} · ${c.state}`));
    }
    $("#lineage-body").replaceChildren(...rows);
    $("#lineage").hidden = !rows.length;
  }
  function forkButton(seq, node) {
    return el("button", { type: "button", class: "fork", text: "fork from here", onclick: async () => {
      let body = { command_id: uuid4(), at: String(seq) };
      if (node.dataset.type === "InputSubmitted") {
        const old = node.querySelector(".text") ? node.querySelector(".text").textContent : "";
        const text = prompt("Fork with this input (edit it to change the past):", old);
        if (text === null) return;
        if (text !== old) body.input = text;
      }
      const doc = await api(`/api/loops/${loopId}/fork`, body);
      flash($("#action-flash"), doc, "forked");
      if (doc.ok) location.href = `/loops/${doc.loop_id}`;
    } });
  }

  const act = async (verb, body) => {
    const doc = await api(`/api/loops/${loopId}/${verb}`, Object.assign({ command_id: uuid4() }, body || {}));
    flash($("#action-flash"), doc, `${verb}: done`);
    return doc;
  };
  $("#input-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const text = $("#input-text").value;
    if (!text.trim()) { flash($("#action-flash"), { ok: false, error: { message: "write something first" } }); return; }
    $("#send").disabled = true;
    const doc = await act("input", { text });
    $("#send").disabled = false;
    if (doc.ok) $("#input-text").value = "";
  });
  $("#interrupt").addEventListener("click", () => act("interrupt"));
  $("#close").addEventListener("click", () => { if (confirm("Close this loop? It takes no more input.")) act("close"); });
}

// --- start ----------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) { LW.token = decodeURIComponent(m[1]); sessionStorage.setItem("lw-token", LW.token); history.replaceState(null, "", location.pathname + location.search); }
  const op = $("#operator");
  if (op) {
    op.value = localStorage.getItem("lw-operator") || "";
    op.addEventListener("change", () => localStorage.setItem("lw-operator", op.value.trim()));
  }
  const tf = $("#token-form");
  if (tf) tf.addEventListener("submit", (ev) => {
    ev.preventDefault();
    LW.token = $("#token-input").value; sessionStorage.setItem("lw-token", LW.token); location.reload();
  });
  const page = document.body.dataset.page;
  if (page === "loops") loopsPage();
  else if (page === "loop") loopPage();
  else if (page === "gates") gatesPage();
  else if (page === "tools") toolsPage();
  else followIndex(null);
});
