// jsonlbatch view: the page over the viewer's JSON API.
// Every string from the server is inserted as text (textContent / text nodes), never as HTML:
// a model answer holding <script> shows as the characters the model wrote.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const FILTERS = ["status", "error", "finish", "model", "q", "size"];
const DEFAULTS = { view: "table", file: "0", status: "all", sort: "line", page: "0", size: "50" };

// -- state in the URL -----------------------------------------------------------------------

function state() {
  const params = new URLSearchParams(location.search);
  const out = { ...DEFAULTS };
  for (const [k, v] of params) out[k] = v;
  return out;
}

function go(changes, { push = true } = {}) {
  const next = { ...state(), ...changes };
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(next)) {
    if (v !== undefined && v !== null && v !== "" && DEFAULTS[k] !== v) params.set(k, v);
  }
  const url = "?" + params.toString();
  if (url !== location.search) (push ? history.pushState : history.replaceState).call(history, null, "", url);
  render();
}

// -- small DOM helpers ----------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  return value.toFixed(digits);
}

function money(value) {
  return value === null || value === undefined ? "" : "$" + value.toFixed(value < 1 ? 4 : 2);
}

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function problem(error) {
  const box = $("#problem");
  box.hidden = !error;
  box.textContent = error ? String(error.message || error) : "";
}

// -- Markdown, built as DOM nodes (no HTML parsing of model text) ---------------------------

function inline(text) {
  const out = document.createDocumentFragment();
  const pattern = /(`[^`\n]+`|\*\*[^*\n]+\*\*|__[^_\n]+__|\*[^*\n]+\*)/g;
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    if (match.index > last) out.append(document.createTextNode(text.slice(last, match.index)));
    const token = match[0];
    if (token.startsWith("`")) out.append(el("code", { text: token.slice(1, -1) }));
    else if (token.startsWith("**") || token.startsWith("__")) out.append(el("strong", { text: token.slice(2, -2) }));
    else out.append(el("em", { text: token.slice(1, -1) }));
    last = match.index + token.length;
  }
  if (last < text.length) out.append(document.createTextNode(text.slice(last)));
  return out;
}

function markdown(text) {
  const root = el("div", { class: "md" });
  const lines = text.split("\n");
  let i = 0;
  let para = [];
  const flush = () => {
    if (para.length) root.append(el("p", {}, inline(para.join("\n"))));
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+.-]*)/);
    if (fence) {
      flush();
      const close = fence[1];
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(close)) body.push(lines[i++]);
      i += 1;
      const code = el("code", { text: body.join("\n") });
      if (fence[2]) code.dataset.lang = fence[2];
      root.append(el("pre", {}, code));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flush();
      root.append(el(heading[1].length <= 2 ? "h3" : "h4", {}, inline(heading[2])));
      i += 1;
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = el(ordered ? "ol" : "ul");
      while (i < lines.length) {
        const m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
        if (!m || /\d/.test(m[1]) !== ordered) break;
        list.append(el("li", {}, inline(m[2])));
        i += 1;
      }
      root.append(list);
      continue;
    }
    if (!line.trim()) flush();
    else para.push(line);
    i += 1;
  }
  flush();
  return root;
}

// -- the header: files, views, live numbers -------------------------------------------------

let files = [];

async function loadFiles() {
  const data = await api("/api/files");
  files = data.files;
  const nav = $("#files");
  nav.replaceChildren(
    ...files.map((f, i) => el("a", { href: "#", text: f.label, title: f.path, "data-file": String(i) }))
  );
}

function markNav() {
  const s = state();
  for (const a of document.querySelectorAll("#files a")) a.classList.toggle("on", a.dataset.file === s.file);
  for (const a of document.querySelectorAll("#views a")) a.classList.toggle("on", a.dataset.view === s.view);
  $("#files").hidden = s.view === "compare" || s.view === "report" || files.length < 2;
}

let lastLines = null;

async function refreshLive() {
  let data;
  try {
    data = await api("/api/live");
  } catch (error) {
    return;
  }
  const s = state();
  const file = data.files[Number(s.file)] || data.files[0];
  const box = $("#live");
  const item = (label, value, cls = "") => el("span", { class: cls }, label + " ", el("b", { text: value }));
  const parts = [
    item("lines", fmt(file.lines)),
    item("ok", fmt(file.status.ok || 0)),
    item("failed", fmt(file.status.failed || 0), file.status.failed ? "bad" : ""),
    item("output tokens", fmt(file.output_tokens)),
  ];
  if (file.lines_per_s) parts.push(item("lines/s", fmt(file.lines_per_s, 1)));
  if (file.cost !== null && file.cost !== undefined) parts.push(item("cost", money(file.cost)));
  if (file.status.cached) parts.push(item("from cache", fmt(file.status.cached)));
  const failures = Object.entries(file.failures).slice(0, 4).map(([k, v]) => `${k} ${v}`).join(", ");
  if (failures) parts.push(item("failures", failures, "bad"));
  const endpoints = Object.entries(file.per_endpoint);
  if (endpoints.length > 1) parts.push(item("per endpoint", endpoints.map(([k, v]) => `${k}: ${v}`).join(" / ")));
  if (!file.done) parts.push(item("indexing", `${Math.round((100 * file.bytes_indexed) / Math.max(file.bytes, 1))}%`));
  const run = data.run;
  if (run) {
    if (run.problem) parts.push(item("run", run.problem, "bad"));
    if (run.state) parts.push(item("run", run.state));
    if (run.total !== undefined) parts.push(item("done", `${fmt(run.written)} of ${fmt(run.total)}`));
    if (run.in_flight !== undefined) parts.push(item("in flight", fmt(run.in_flight)));
    if (run.concurrency !== undefined && run.concurrency !== null) parts.push(item("concurrency", fmt(run.concurrency)));
    if (run.retrying) parts.push(item("retrying", fmt(run.retrying)));
    if (run.paced) parts.push(item("paced", run.paced));
    if (run.per_endpoint && Object.keys(run.per_endpoint).length) {
      parts.push(item("load", Object.entries(run.per_endpoint).map(([k, v]) => `${k}: ${v}`).join(" / ")));
    }
    if (run.prefix_cache_hit_rate !== undefined && run.prefix_cache_hit_rate !== null) {
      parts.push(item("prefix-cache hits", `${(100 * run.prefix_cache_hit_rate).toFixed(1)}%`));
    }
  }
  box.replaceChildren(...parts);
  box.dataset.lines = String(file.lines);
  // A growing file: show new rows where they would appear (the first page, or line order).
  if (lastLines !== null && file.lines !== lastLines && s.view === "table") loadRows({ keepDetail: true });
  lastLines = file.lines;
}

// -- the table ------------------------------------------------------------------------------

function setOptions(select, counts, current, allLabel = "any") {
  const options = [el("option", { value: "", text: allLabel })];
  for (const [name, count] of Object.entries(counts)) {
    options.push(el("option", { value: name, text: `${name} (${fmt(count)})` }));
  }
  if (current && !(current in counts)) options.push(el("option", { value: current, text: `${current} (0)` }));
  select.replaceChildren(...options);
  select.value = current || "";
}

function statusCell(row) {
  if (row.unreadable) return el("span", { class: "tag bad", text: "unreadable" });
  if (!row.ok) return el("span", { class: "tag bad", text: row.error || "failed" });
  return el("span", { class: "tag ok", text: String(row.status || "ok") });
}

function verdictCell(row) {
  if (!row.verdict && !row.cached) return "";
  const out = document.createDocumentFragment();
  if (row.verdict) out.append(el("span", { class: row.verdict === "valid" ? "tag ok" : "tag bad", text: row.verdict }));
  if (row.cached) out.append(el("span", { class: "tag info", text: "cache" }));
  return out;
}

let rowsToken = 0;

async function loadRows({ keepDetail = false } = {}) {
  const s = state();
  const params = new URLSearchParams({ file: s.file, sort: s.sort, page: s.page, size: s.size });
  if (s.desc) params.set("desc", s.desc);
  for (const k of ["status", "error", "finish", "model", "q"]) if (s[k] && s[k] !== "all") params.set(k, s[k]);
  const token = ++rowsToken;
  let data;
  try {
    data = await api("/api/rows?" + params);
  } catch (error) {
    problem(error);
    return;
  }
  if (token !== rowsToken) return; // a newer request was made meanwhile
  problem(null);
  const form = $("#filters");
  const statusCounts = { ...data.facets.status };
  const statusOptions = [el("option", { value: "all", text: `all (${fmt(data.file.lines)})` })];
  for (const [name, count] of Object.entries(statusCounts)) {
    statusOptions.push(el("option", { value: name, text: `${name} (${fmt(count)})` }));
  }
  form.elements.status.replaceChildren(...statusOptions);
  form.elements.status.value = s.status;
  setOptions(form.elements.error, data.facets.error, s.error);
  setOptions(form.elements.finish, data.facets.finish, s.finish);
  setOptions(form.elements.model, data.facets.model, s.model);
  if (document.activeElement !== form.elements.q) form.elements.q.value = s.q || "";
  form.elements.size.value = s.size;
  for (const th of document.querySelectorAll("#rows th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === s.sort);
    th.classList.toggle("desc", th.dataset.sort === s.sort && !!s.desc);
  }
  const body = $("#rows tbody");
  body.replaceChildren(
    ...data.rows.map((row) => {
      const tr = el(
        "tr",
        { "data-row": String(row.row), class: String(row.row) === s.open ? "open" : "" },
        el("td", { class: "num", text: fmt(row.line) }),
        el("td", { class: "id", text: row.custom_id ?? "", title: row.custom_id ?? "" }),
        el("td", {}, statusCell(row)),
        el("td", {}, row.truncated ? el("span", { class: "tag warn", text: row.finish }) : row.finish ?? ""),
        el("td", { class: "num", text: fmt(row.prompt_tokens) }),
        el("td", { class: "num", text: fmt(row.completion_tokens) }),
        el("td", { class: "num", text: row.latency === null ? "" : fmt(row.latency, 2) + " s" }),
        el("td", { class: "num", text: row.ttft === null ? "" : fmt(row.ttft, 3) + " s" }),
        el("td", { class: "num", text: money(row.cost) }),
        el("td", {}, verdictCell(row))
      );
      return tr;
    })
  );
  if (!data.rows.length) {
    body.append(el("tr", {}, el("td", { colSpan: 10, class: "muted", text: data.file.done ? "no lines match" : "indexing..." })));
  }
  const start = data.page * data.size;
  $("#range").textContent = data.total
    ? `${fmt(start + 1)}-${fmt(start + data.rows.length)} of ${fmt(data.total)}` + (data.file.done ? "" : " (indexing)")
    : "0 rows";
  $('#pager [data-step="-1"]').disabled = data.page <= 0;
  $('#pager [data-step="1"]').disabled = start + data.rows.length >= data.total;
  if (!keepDetail) loadDetail();
}

// -- one request ----------------------------------------------------------------------------

function turn(role, content, cls = "") {
  return el("div", { class: `turn ${role} ${cls}` }, el("div", { class: "role", text: role }), content);
}

// a tool call: its name, its id, its arguments (indented JSON, as text)
function callBlock(call) {
  const head = el("div", { class: "meta" }, el("strong", { text: `\u2192 ${call.name || "(no name)"}` }));
  if (call.id) head.append(el("span", { text: call.id }));
  return el("div", { class: "call" }, head, el("pre", { class: "wrap" }, el("code", { text: call.arguments })));
}

// one prompt turn of the thread: its text, the calls it makes, or the call it answers
function promptTurn(t) {
  const parts = [];
  if (t.tool_call_id) {
    const what = t.name ? `result of ${t.name}` : "result";
    parts.push(el("div", { class: "meta" }, el("span", { text: what }), el("span", { text: t.tool_call_id })));
  }
  if (t.text) parts.push(markdown(t.text));
  for (const m of t.media || []) parts.push(mediaBlock(m));
  for (const call of t.calls || []) parts.push(callBlock(call));
  return turn(t.role, el("div", {}, ...parts));
}

function answerBlock(choice) {
  const parts = [];
  const meta = [`choice ${choice.index}`];
  if (choice.finish_reason) meta.push(`finish: ${choice.finish_reason}`);
  parts.push(el("div", { class: "meta", text: meta.join(" · ") }));
  if (choice.reasoning) {
    parts.push(el("details", {}, el("summary", { text: `reasoning (${fmt(choice.reasoning.length)} characters)` }), markdown(choice.reasoning)));
  }
  if (choice.json) parts.push(el("pre", { class: "json" }, el("code", { text: choice.json })));
  else parts.push(markdown(choice.text));
  for (const call of choice.calls || []) parts.push(callBlock(call));
  return turn("assistant", el("div", {}, ...parts));
}

// a calls file's line: every line of its conversation in order, the open one marked
function conversationStrip(data) {
  const items = (data.conversation || []).map((c) => {
    const label = `turn ${c.turn}` + (c.ask ? ` · ask ${c.ask}` : "");
    const attrs = { class: c.row === data.row ? "open" : "", "data-open-row": String(c.row) };
    return el("li", attrs, el("strong", { text: label }), el("span", { text: ` ${c.summary}` }));
  });
  return el("details", { class: "conversation", open: true }, el("summary", { text: `conversation (${items.length} lines)` }), el("ol", {}, ...items));
}

function mediaBlock(m) {
  const label = [m.kind, m.mime, m.bytes ? `${fmt(m.bytes)} bytes` : "", m.filename].filter(Boolean).join(" · ");
  if (m.src) {
    return el("a", { href: m.src, target: "_blank", rel: "noopener", class: "thumb", title: label },
      el("img", { src: m.src, alt: label, loading: "lazy" }));
  }
  return el("div", { class: "media muted", text: `[${label}${m.url ? ": " + m.url : ""}]` });
}

function requestView(data, { compact = false } = {}) {
  const parts = [];
  if (!compact && (data.conversation || []).length > 1) parts.push(conversationStrip(data));
  if (data.problem) parts.push(turn("error", el("p", { text: data.problem }), "error"));
  if (!compact) {
    for (const t of data.prompt || []) parts.push(promptTurn(t));
    if (data.prompt_note) parts.push(el("p", { class: "muted", text: data.prompt_note }));
    else if (!data.request_known) parts.push(el("p", { class: "muted", text: "Prompt not shown: start the viewer with --requests REQUESTS.jsonl to see it." }));
  }
  if (data.error) parts.push(turn("error", el("pre", { class: "wrap" }, el("code", { text: data.error })), "error"));
  for (const choice of data.choices || []) parts.push(answerBlock(choice));
  if (data.files && data.files.length) {  // exec --files-dir: what the container wrote
    const rows = data.files.map((f) => el("tr", {}, el("td", { text: f.path }), el("td", { text: f.bytes === null ? "?" : `${fmt(f.bytes)} bytes` })));
    parts.push(el("div", { class: "files" }, el("div", { class: "meta", text: `files (${data.files.length})` }), el("table", {}, el("tbody", {}, ...rows))));
  }
  if (!compact && data.metrics) {
    const rows = Object.entries(data.metrics).map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { text: typeof v === "object" ? JSON.stringify(v) : String(v) })));
    parts.push(el("details", {}, el("summary", { text: "metrics" }), el("table", {}, el("tbody", {}, ...rows))));
  }
  const raw = el("pre", { class: "wrap raw" }, el("code", { text: data.raw + (data.raw_cut ? "\n[cut]" : "") }));
  parts.push(el("details", { class: "raw-line" }, el("summary", { text: "raw line" }), raw));
  return parts;
}

async function loadDetail() {
  const s = state();
  const box = $("#detail");
  if (!s.open) {
    box.hidden = true;
    return;
  }
  let data;
  try {
    data = await api(`/api/line?file=${encodeURIComponent(s.file)}&row=${encodeURIComponent(s.open)}`);
  } catch (error) {
    problem(error);
    return;
  }
  const meta = [`line ${fmt(data.line)}`];
  if (data.model) meta.push(data.model);
  if (data.usage) meta.push(`tokens ${fmt(data.usage.prompt_tokens)} in / ${fmt(data.usage.completion_tokens)} out`);
  const head = [el("h2", { text: data.custom_id ?? `line ${data.line}` }), el("div", { class: "meta", text: meta.join(" · ") })];
  const buttons = el("div", { class: "meta" }, el("button", { type: "button", text: "close", "data-close": "1" }));
  if (files.length > 1 && data.custom_id) buttons.append(el("button", { type: "button", text: "compare across files", "data-compare": data.custom_id }));
  box.replaceChildren(...head, buttons, ...requestView(data));
  box.hidden = false;
}

// -- side by side ---------------------------------------------------------------------------

function answerText(pane) {
  return (pane.error ? "ERROR " + pane.error + "\n" : "") + (pane.choices || []).map((c) => c.json || c.text).join("\n---\n");
}

function lcsMarks(base, other) {
  // Which lines of `other` are not in a longest common subsequence with `base`.
  const a = base.split("\n").slice(0, 2000);
  const b = other.split("\n").slice(0, 2000);
  const dp = Array.from({ length: a.length + 1 }, () => new Uint16Array(b.length + 1));
  for (let i = a.length - 1; i >= 0; i--) for (let j = b.length - 1; j >= 0; j--) {
    dp[i][j] = a[i] === b[j] ? dp[i + 1][j + 1] + 1 : Math.max(dp[i + 1][j], dp[i][j + 1]);
  }
  const added = new Set();
  let i = 0, j = 0;
  while (j < b.length) {
    if (i < a.length && a[i] === b[j]) { i++; j++; }
    else if (i < a.length && dp[i + 1][j] >= dp[i][j + 1]) i++;
    else { added.add(j); j++; }
  }
  return { lines: b, added };
}

async function loadCompare() {
  const s = state();
  const form = $("#compare-form");
  if (document.activeElement !== form.elements.id) form.elements.id.value = s.id || "";
  const box = $("#panes");
  if (!s.id) {
    box.replaceChildren(el("p", { class: "muted", text: "Give a custom_id to see its answer in every file side by side." }));
    return;
  }
  let data;
  try {
    data = await api("/api/compare?id=" + encodeURIComponent(s.id));
  } catch (error) {
    problem(error);
    return;
  }
  problem(null);
  const base = data.panes.find((p) => p.found);
  const baseText = base ? answerText(base) : "";
  box.replaceChildren(
    ...data.panes.map((pane) => {
      const node = el("div", { class: "pane" }, el("h2", { text: pane.label }));
      if (!pane.found) {
        node.append(el("p", { class: "muted", text: "not in this file" }));
        return node;
      }
      const text = answerText(pane);
      const differs = pane !== base && text !== baseText;
      node.classList.toggle("differs", differs);
      node.append(el("div", { class: "meta", text: `line ${fmt(pane.line)}${differs ? " · differs from " + base.label : pane === base ? " · baseline" : " · same answer"}` }));
      if (differs) {
        const { lines, added } = lcsMarks(baseText, text);
        const pre = el("pre", { class: "wrap diff" });
        lines.forEach((line, k) => pre.append(el("span", { class: added.has(k) ? "diff-add" : "", text: line + "\n" })));
        node.append(pre);
        node.append(el("details", {}, el("summary", { text: "rendered" }), ...requestView(pane, { compact: true })));
      } else {
        node.append(...requestView(pane, { compact: true }));
      }
      return node;
    })
  );
}

// -- wiring ---------------------------------------------------------------------------------

function render() {
  const s = state();
  markNav();
  $("#table-view").hidden = s.view !== "table";
  $("#compare-view").hidden = s.view !== "compare";
  $("#report-view").hidden = s.view !== "report";
  if (s.view === "table") loadRows();
  else if (s.view === "compare") loadCompare();
  else if (s.view === "report" && !$("#report").src) $("#report").src = "/report";
}

function wire() {
  $("#files").addEventListener("click", (e) => {
    const a = e.target.closest("a[data-file]");
    if (!a) return;
    e.preventDefault();
    go({ file: a.dataset.file, page: "0", open: "" });
  });
  $("#views").addEventListener("click", (e) => {
    const a = e.target.closest("a[data-view]");
    if (!a) return;
    e.preventDefault();
    go({ view: a.dataset.view });
  });
  const form = $("#filters");
  form.addEventListener("change", (e) => {
    if (e.target.name === "q") return;
    go({ [e.target.name]: e.target.value, page: "0" });
  });
  let typing;
  form.elements.q.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => go({ q: form.elements.q.value, page: "0" }, { push: false }), 300);
  });
  form.addEventListener("submit", (e) => e.preventDefault());
  $("#rows thead").addEventListener("click", (e) => {
    const th = e.target.closest("th[data-sort]");
    if (!th) return;
    const s = state();
    const same = s.sort === th.dataset.sort;
    go({ sort: th.dataset.sort, desc: same && !s.desc ? "1" : "", page: "0" });
  });
  $("#rows tbody").addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-row]");
    if (tr) go({ open: tr.dataset.row });
  });
  $("#pager").addEventListener("click", (e) => {
    const b = e.target.closest("button[data-step]");
    if (b) go({ page: String(Math.max(0, Number(state().page) + Number(b.dataset.step))) });
  });
  $("#detail").addEventListener("click", (e) => {
    if (e.target.closest("[data-close]")) go({ open: "" });
    const other = e.target.closest("[data-open-row]");
    if (other) go({ open: other.dataset.openRow });
    const cmp = e.target.closest("[data-compare]");
    if (cmp) go({ view: "compare", id: cmp.dataset.compare });
  });
  $("#compare-form").addEventListener("submit", (e) => {
    e.preventDefault();
    go({ id: e.target.elements.id.value });
  });
  window.addEventListener("popstate", render);
}

async function start() {
  wire();
  try {
    await loadFiles();
  } catch (error) {
    problem(error);
    return;
  }
  render();
  await refreshLive();
  setInterval(() => {
    if (!document.hidden) refreshLive();
  }, 1000);
}

start();
