// kvcargo ui: the calculator and the live simulator. Every number comes from the JSON API (the
// same code as the CLI); this script only collects inputs, draws and plots.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { catalog: null, presets: [], calcSeq: 0, calcAbort: null, handoff: null, last: null, pinned: null,
  restored: false };

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function showError(id, message) {
  const box = $(id);
  box.textContent = message || "";
  box.hidden = !message;
}

async function api(path, options = {}) {
  let resp;
  try {
    resp = await fetch(path, options);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new Error("the kvcargo server is not reachable (is `kvcargo ui` still running?)");
  }
  let data = null;
  try {
    data = await resp.json();
  } catch (_) {
    data = null;
  }
  if (!resp.ok) {
    const msg = data && data.error ? data.error : `HTTP ${resp.status}`;
    const e = new Error(msg);
    e.status = resp.status;
    e.field = data && typeof data.field === "string" ? data.field : null;
    throw e;
  }
  return data;
}

function fillSelect(select, entries, { blank = null, value = null } = {}) {
  select.replaceChildren();
  if (blank !== null) select.append(el("option", { value: "", text: blank }));
  for (const [key, label] of entries) select.append(el("option", { value: key, text: label }));
  if (value !== null && value !== undefined) select.value = value;
}

const named = (table, skip = []) =>
  Object.entries(table).filter(([k]) => !skip.includes(k)).map(([k, v]) => [k, `${v.name} (${k})`]);

// ---------------------------------------------------------------------------------- calculator

function calcParams() {
  const p = new URLSearchParams();
  p.set("model", $("#calc-model").value);
  p.set("prompt", $("#calc-prompt").value);
  p.set("link", $("#calc-link").value);
  const codec = $("#calc-kv_compress").value;
  if (codec) p.set("kv_compress", codec);
  if (codec) p.set("kv_compress_at", $("#calc-kv_compress_at").value);
  if (codec === "freq-keep-k") p.set("kv_keep", $("#calc-kv_keep").value);
  if (codec && state.catalog.codecs[codec].kind === "ratio") p.set("kv_ratio", $("#calc-kv_ratio").value);
  p.set("send", document.querySelector('input[name="send"]:checked').value);
  p.set("device", $("#calc-device").value);
  p.set("devices_per_instance", $("#calc-devices_per_instance").value);
  return p;
}

async function updateCalculator() {
  const seq = ++state.calcSeq;
  if (state.calcAbort) state.calcAbort.abort();
  const abort = new AbortController();
  state.calcAbort = abort;
  const codec = $("#calc-kv_compress").value;
  $("#calc-kv_compress_at-field").hidden = !codec;
  $("#calc-kv_keep-field").hidden = codec !== "freq-keep-k";
  $("#calc-kv_ratio-field").hidden = !codec || state.catalog.codecs[codec].kind !== "ratio";
  const prompt = Number($("#calc-prompt").value);
  $("#calc-prompt-out").textContent = Number.isFinite(prompt) && $("#calc-prompt").value !== ""
    ? prompt.toLocaleString("en-US") : "?";
  try {
    const r = await api("/api/handoff?" + calcParams().toString(), { signal: abort.signal });
    if (seq !== state.calcSeq) return;
    showFieldError("calc", null);
    renderPanel(r);
    state.handoff = r;
    drawTimeline(r);
  } catch (err) {
    if (err.name === "AbortError" || seq !== state.calcSeq) return;
    showFieldError("calc", err);
  } finally {
    saveState();
  }
}

function renderPanel(r) {
  $("#calc-title").textContent = r.panel.title;
  $("#calc-explain").textContent = r.panel.explain;
  $("#calc-explain").hidden = !r.panel.explain;
  const body = $("#calc-table tbody");
  body.replaceChildren();
  r.panel.rows.forEach(([label, value, note], i) => {
    body.append(el("tr", { "data-row": String(i) },
      el("th", { scope: "row", text: label }), el("td", { class: "value", text: value }),
      el("td", { class: "note", text: note })));
  });
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text = null) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== null) e.textContent = text;
  return e;
}

function fmtMs(s) {
  const ms = s * 1e3;
  if (ms >= 100) return `${Math.round(ms).toLocaleString("en-US")} ms`;
  if (ms >= 1) return `${ms.toPrecision(3)} ms`;
  return `${(ms * 1e3).toPrecision(3)} µs`;
}

function niceStep(span, target) {
  const raw = span / target;
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

// The slices of a layer-wise send: layer l is final at l·Tp/L and its slice (T'x/L) leaves when
// both it and the link are ready. The end of the last slice plus the latency is the exposed end.
function layerSlices(tp, wire, layers) {
  const out = [];
  let end = 0;
  for (let l = 1; l <= layers; l++) {
    const start = Math.max((l * tp) / layers, end);
    end = start + wire / layers;
    const last = out[out.length - 1];
    if (last && Math.abs(last[1] - start) <= 1e-12 * Math.max(1, end)) last[1] = end;
    else out.push([start, end]);
  }
  return out;
}

// Drawn at the figure's own width in pixels (redrawn when it changes), so that its text stays
// 11-12 px on a phone instead of shrinking with the picture.
function drawTimeline(r) {
  const box = $("#calc-timeline");
  box.replaceChildren();
  const W = Math.max(280, Math.min(800, Math.round(box.clientWidth || 800))), H = 170;
  const narrow = W < 560;
  box.setAttribute("viewBox", `0 0 ${W} ${H}`);
  box.setAttribute("height", String(H));
  const left = narrow ? 66 : 150, right = narrow ? 12 : 20, top = 18, rowH = 34;
  const tp = r.prefill_s, lat = r.latency_s, wire = r.transfer_s - r.latency_s;
  const layerwise = r.send === "layerwise";
  const landed = tp + r.exposed_s;
  const span = Math.max(landed, tp) * 1.04;
  const x = (t) => left + ((W - left - right) * t) / span;
  const sent = narrow ? (layerwise ? `${r.layers} slices` : "transfer")
    : (layerwise ? `transfer, ${r.layers} slices` : "transfer (whole)");
  const rows = [["prefill", 0], [sent, 1]];
  for (const [label, i] of rows) {
    box.append(svg("text", { x: 8, y: top + i * rowH + 20, class: "tl-label" }, label));
  }
  // prefill bar, with layer boundaries when streaming
  box.append(svg("rect", { x: x(0), y: top + 6, width: Math.max(1, x(tp) - x(0)), height: 20, class: "tl-prefill" }));
  if (layerwise && x(tp) - x(0) > 2 * r.layers) {
    for (let l = 1; l < r.layers; l++) {
      const xl = x((l * tp) / r.layers);
      box.append(svg("line", { x1: xl, x2: xl, y1: top + 6, y2: top + 26, class: "tl-layer" }));
    }
  }
  const y1 = top + rowH + 6;
  const spans = layerwise ? layerSlices(tp, wire, r.layers) : [[tp, tp + wire]];
  for (const [a, b] of spans) {
    box.append(svg("rect", { x: x(a), y: y1, width: Math.max(1, x(b) - x(a)), height: 20, class: "tl-transfer" }));
  }
  const lastEnd = spans[spans.length - 1][1];
  if (lat > 0) {
    box.append(svg("rect", { x: x(lastEnd), y: y1, width: Math.max(1, x(lastEnd + lat) - x(lastEnd)), height: 20,
      class: "tl-latency" }));
  }
  // the exposed part: after the prefill, until the cache has landed
  const ye = top + 2 * rowH + 4;
  box.append(svg("rect", { x: x(tp), y: top + 2, width: Math.max(2, x(landed) - x(tp)), height: 2 * rowH - 4,
    class: "tl-exposed" }));
  box.append(svg("line", { x1: x(tp), x2: x(tp), y1: top, y2: ye, class: "tl-mark" }));
  box.append(svg("line", { x1: x(landed), x2: x(landed), y1: top, y2: ye, class: "tl-mark" }));
  const exposedText = r.panel.rows.find((row) => row[0] === "Exposed after prefill")[1];
  const lx = Math.max(4, Math.min(x(tp) + 4, W - right - 190));
  box.append(svg("text", { x: lx, y: ye + 14, class: "tl-exposed-label", id: "calc-exposed-label" },
    `exposed after prefill: ${exposedText}`));
  // time axis
  const ya = top + 2 * rowH + 34;
  box.append(svg("line", { x1: x(0), x2: x(span), y1: ya, y2: ya, class: "tl-axis" }));
  const step = niceStep(span, narrow ? 3 : 6);
  for (let t = 0; t <= span + 1e-15; t += step) {
    box.append(svg("line", { x1: x(t), x2: x(t), y1: ya, y2: ya + 5, class: "tl-axis" }));
    box.append(svg("text", { x: x(t), y: ya + 18, class: "tl-tick" }, t === 0 ? "0" : fmtMs(t)));
  }
}

function setPrompt(value, from) {
  if (from !== "range") $("#calc-prompt-range").value = value;
  if (from !== "number") $("#calc-prompt").value = value;
  updateCalculator();
}

function setupCalculator(cat) {
  const d = cat.defaults.handoff;
  fillSelect($("#calc-model"), named(cat.models), { value: d.model });
  fillSelect($("#calc-link"), named(cat.links), { value: d.link });
  fillSelect($("#calc-kv_compress"), named(cat.codecs, ["none"]), { blank: "uncompressed", value: d.kv_compress || "" });
  fillSelect($("#calc-device"), named(cat.devices), { value: d.device });
  $("#calc-devices_per_instance").value = d.devices_per_instance;
  $("#calc-kv_compress_at").value = d.kv_compress_at;
  $("#calc-prompt").max = cat.limits.max_prompt;
  document.querySelector(`input[name="send"][value="${d.send}"]`).checked = true;
  $("#calc-prompt-range").addEventListener("input", (e) => setPrompt(e.target.value, "range"));
  $("#calc-prompt").addEventListener("input", (e) => setPrompt(e.target.value, "number"));
  for (const id of ["#calc-model", "#calc-link", "#calc-kv_compress", "#calc-kv_compress_at", "#calc-device"]) {
    $(id).addEventListener("change", updateCalculator);
  }
  for (const id of ["#calc-kv_keep", "#calc-kv_ratio", "#calc-devices_per_instance"]) {
    $(id).addEventListener("input", updateCalculator);
  }
  for (const r of document.querySelectorAll('input[name="send"]')) r.addEventListener("change", updateCalculator);
  $("#calc-form").addEventListener("submit", (e) => e.preventDefault());
  if (window.ResizeObserver) {
    let width = 0;
    new ResizeObserver(([entry]) => {
      const w = Math.round(entry.contentRect.width);
      if (w !== width && state.handoff) drawTimeline(state.handoff);
      width = w;
    }).observe($("#calc-timeline"));
  }
  setPrompt(d.prompt, null);
}

// ----------------------------------------------------------------------------------- simulator

// name, label, kind, group; kinds: int, float, select:<table> (catalog), choice:<a|b>
const SIM_FIELDS = [
  ["rate", "Rate (req/s)", "float", "Load"],
  ["requests", "Requests", "int", "Load"],
  ["prompt", "Mean prompt (tokens)", "float", "Load"],
  ["output", "Mean output (tokens)", "float", "Load"],
  ["seed", "Seed", "int", "Load"],
  ["ttft_slo", "TTFT SLO (s)", "float", "Load"],
  ["tpot_slo", "TPOT SLO (s)", "float", "Load"],
  ["model", "Model", "select:models", "Pools"],
  ["mode", "Mode", "choice:disagg|colocated", "Pools"],
  ["prefill", "Prefill instances", "int", "Pools"],
  ["decode", "Decode instances", "int", "Pools"],
  ["device", "Device", "select:devices", "Pools"],
  ["devices_per_instance", "Devices per instance", "int", "Pools"],
  ["prefill_device", "Prefill device", "select:devices:same as device", "Pools"],
  ["decode_device", "Decode device", "select:devices:same as device", "Pools"],
  ["link", "Link", "select:links", "Hand-off"],
  ["kv_compress", "Codec", "select:codecs:uncompressed", "Hand-off"],
  ["kv_compress_at", "Codec placement", "choice:transit|endpoint", "Hand-off"],
  ["kv_keep", "Kept fraction (freq-keep-k)", "float", "Hand-off"],
  ["kv_ratio", "Wire ratio (ratio codec)", "float", "Hand-off"],
  ["send", "Send", "choice:whole|layerwise", "Hand-off"],
  ["topology", "Topology", "choice:shared|nic|nvlink-domain", "Hand-off"],
  ["link_sharing", "Link sharing", "choice:fcfs|fair", "Hand-off"],
  ["kv_reserve", "Decode KV reserved", "choice:at-decode|at-transfer", "Hand-off"],
  ["cost_model", "Cost model", "choice:roofline|calibrated", "Pools"],
  ["link_model", "Link model", "choice:line-rate|measured", "Hand-off"],
  ["batch_policy", "Batching", "choice:prefill-priority|decode-priority|chunked", "Scheduling & memory"],
  ["max_num_batched_tokens", "Tokens per step", "int", "Scheduling & memory"],
  ["kv_policy", "KV reservation", "choice:oracle|pow2|max|paged", "Scheduling & memory"],
  ["kv_block_size", "KV block (tokens, paged)", "int", "Scheduling & memory"],
  ["max_seq_len", "Reserved length (max)", "int", "Scheduling & memory"],
  ["preemption", "Preemption (paged)", "choice:|recompute|swap", "Scheduling & memory"],
  ["host_link", "Swap link", "select:links:pcie5", "Scheduling & memory"],
  ["prefix_caching", "Prefix caching", "switch", "Scheduling & memory"],
  ["workload", "Named workload", "choice:|chat|coding-agent|offline-batch|long-rag|voice", "Workload"],
  ["turns", "Turns per session", "int", "Workload"],
  ["think", "Think time (s)", "float", "Workload"],
  ["system_prompts", "System prompts", "int", "Workload"],
  ["system_len", "System prompt (tokens)", "int", "Workload"],
  ["prefix_share", "Sessions with one", "float", "Workload"],
  ["tp", "Tensor parallel (tp)", "int", "Parallelism and formats"],
  ["pp", "Pipeline stages (pp)", "int", "Parallelism and formats"],
  ["ep", "Expert parallel (ep)", "int", "Parallelism and formats"],
  ["microbatches", "Micro-batches", "int", "Parallelism and formats"],
  ["scale_up_link", "Scale-up link", "select:links:the device's own", "Parallelism and formats"],
  ["weight_format", "Weight format", "choice:bf16|fp8|int8|int4|fp4", "Parallelism and formats"],
  ["kv_format", "KV format", "choice:bf16|fp8|int8|int4|fp4", "Parallelism and formats"],
  ["compute_format", "Compute format", "choice:bf16|fp8|int8|int4|fp4", "Parallelism and formats"],
  ["speculative", "Speculative draft", "select:models:off", "Parallelism and formats"],
  ["gamma", "Drafted tokens (gamma)", "int", "Parallelism and formats"],
  ["alpha", "Acceptance (alpha)", "float", "Parallelism and formats"],
  ["ced_encoder_layers", "CED encoder layers (0: off)", "int", "Model family"],
  ["ced_replay", "CED replay (tokens)", "int", "Model family"],
  ["ced_replay_on", "CED replay on", "choice:|prefill|decode", "Model family"],
  ["fft_efficiency", "FFT efficiency (digital)", "float", "Model family"],
  ["ft_enob", "Optical engine ENOB", "int", "Model family"],
  ["ft_static_w", "Optical engine static W", "float", "Model family"],
  ["ft_mask_rate", "Optical mask rate (Hz)", "float", "Model family"],
  ["ft_samples_per_s", "Optical samples/s", "float", "Model family"],
  ["ft_detection", "Optical detection", "choice:|coherent|intensity", "Model family"],
  ["ft_overlap", "Optical/digital overlap", "switch", "Model family"],
];
const DRAFTS = [["mtp", "MTP head (one extra layer)"]];

function simDefault(name) {
  const d = state.catalog.defaults;
  if (name === "rate") return d.rate;
  const v = d.simulate[name];
  return v === null || v === undefined ? "" : typeof v === "boolean" ? String(v) : v;
}

function setupSimulator(cat, presets) {
  const box = $("#sim-fields");
  const groups = {};
  for (const [name, label, kind, group] of SIM_FIELDS) {
    if (!groups[group]) {
      groups[group] = el("fieldset", { class: "group" }, el("legend", { text: group }));
      box.append(groups[group]);
    }
    let input;
    if (kind.startsWith("select:")) {
      const [, table, blank] = kind.split(":");
      input = el("select", { id: `sim-${name}`, name });
      const entries = named(cat[table], table === "codecs" ? ["none"] : []);
      fillSelect(input, name === "speculative" ? [...DRAFTS, ...entries] : entries, { blank: blank ?? null });
    } else if (kind === "switch") {
      input = el("select", { id: `sim-${name}`, name });
      fillSelect(input, [["false", "off"], ["true", "on"]]);
    } else if (kind.startsWith("choice:")) {
      input = el("select", { id: `sim-${name}`, name });
      // a leading empty choice: unset (the model's or device's own value)
      fillSelect(input, kind.slice(7).split("|").map((c) => [c, c || "model's / device's"]));
    } else {
      input = el("input", { id: `sim-${name}`, name, type: "number", step: kind === "int" ? "1" : "any" });
      if (name === "requests") input.max = cat.limits.max_requests;
    }
    input.dataset.kind = kind;
    input.addEventListener("input", markCustom);
    input.addEventListener("change", saveState);
    groups[group].append(el("label", {}, label + " ", input));
  }
  const byGroup = new Map();
  for (const p of presets) {
    if (!byGroup.has(p.group)) byGroup.set(p.group, el("optgroup", { label: p.group }));
    byGroup.get(p.group).append(el("option", { value: p.key, text: p.title }));
  }
  for (const g of byGroup.values()) $("#sim-preset").append(g);
  $("#sim-preset").addEventListener("change", (e) => applyPreset(e.target.value));
  $("#sim-defaults").addEventListener("click", () => { $("#sim-preset").value = ""; applyPreset(""); });
  $("#sim-form").addEventListener("submit", (e) => { e.preventDefault(); runSimulation(); });
  $("#sim-pin").addEventListener("click", () => pinRun(state.last));
  $("#sim-unpin").addEventListener("click", () => pinRun(null));
  applyPreset("");
}

function resetSimFields() {
  for (const [name] of SIM_FIELDS) $(`#sim-${name}`).value = simDefault(name);
}

function markCustom() {
  if ($("#sim-preset").value) {
    $("#sim-preset").value = "";
    $("#sim-preset-note").textContent = "Custom configuration.";
  }
  saveState();
}

function applyPreset(key) {
  resetSimFields();
  const p = state.presets.find((x) => x.key === key);
  if (!p) {
    $("#sim-preset-note").textContent = "The chapter's base scenario (the CLI defaults); edit anything.";
    saveState();
    return;
  }
  for (const [name, value] of Object.entries(p.params)) $(`#sim-${name}`).value = value;
  $("#sim-preset-note").textContent = p.note;
  saveState();
}

// The body: every field that differs from the CLI default (an empty field is the default).
function simBody() {
  const body = {};
  for (const [name, , kind] of SIM_FIELDS) {
    const input = $(`#sim-${name}`);
    if (input.validity && input.validity.badInput) {
      const e = new Error(`${quoted(SIM_LABELS[name])} is not a number`);
      e.field = name;
      throw e;
    }
    const raw = input.value;
    if (raw === "") continue;
    const value = kind === "int" || kind === "float" ? Number(raw) : kind === "switch" ? raw === "true" : raw;
    if (value === simDefault(name) || raw === String(simDefault(name))) continue;
    body[name] = value;
  }
  return body;
}

function cliCommand(body) {
  const args = Object.entries(body).map(([k, v]) => `--${k.replaceAll("_", "-")}${v === true ? "" : ` ${v}`}`);
  return ["kvcargo simulate", ...args].join(" ");
}

// Run the form's configuration (or `given`, a body, for a pinned run restored from the URL).
async function runSimulation(given = null) {
  let body = given;
  if (body === null) {
    try {
      body = simBody();
    } catch (err) {
      showFieldError("sim", err);
      return null;
    }
  }
  const preset = given ? null : state.presets.find((x) => x.key === $("#sim-preset").value) || null;
  const button = $("#sim-run");
  button.disabled = true;
  $("#sim-status").textContent = "running…";
  showFieldError("sim", null);
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), (state.catalog.limits.timeout_s + 60) * 1000);
  try {
    const r = await api("/api/simulate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: abort.signal,
    });
    renderResults(r, body, preset);
    // what the run ignored or clipped of the parameters (the command line's stderr notes)
    const notes = (r.notes || []).length ? ` — note: ${r.notes.join("; ")}` : "";
    $("#sim-status").textContent = `done in ${r.wall_s.toFixed(2)} s${notes}`;
    return state.last;
  } catch (err) {
    showFieldError("sim", err.name === "AbortError" ? new Error("no answer from the server") : err);
    $("#sim-status").textContent = "";
    return null;
  } finally {
    clearTimeout(timer);
    button.disabled = false;
  }
}

function renderResults(r, body, preset) {
  state.last = { body, result: r, preset, command: cliCommand(body) };
  $("#sim-results").hidden = false;
  showResults();
}

// The results panel: this run, the pinned run (its column and dashed curves) and the chapter.
function showResults() {
  const { result: r, preset, command } = state.last;
  const pinned = state.pinned;
  $("#sim-command").textContent = command;
  $("#sim-pinned").hidden = !pinned;
  $("#sim-pinned-command").textContent = pinned ? pinned.command : "";
  $("#sim-unpin").hidden = !pinned;
  $("#sim-pin").textContent = pinned ? "Pin this run instead" : "Pin this run";
  $("#sim-pin").disabled = pinned === state.last;
  $("#sim-pinned-head").hidden = !pinned;
  const chapter = {};
  if (preset) for (const c of preset.chapter) chapter[c.key] = c.unit === "%" ? `${c.text}%` : `${c.text} ${c.unit}`;
  const before = {};
  if (pinned) for (const row of pinned.result.table) before[row.key] = row.text;
  const tbody = $("#sim-table tbody");
  tbody.replaceChildren();
  for (const row of r.table) {
    const cells = [el("th", { scope: "row", text: row.label }), el("td", { class: "value", text: row.text })];
    if (pinned) cells.push(el("td", { class: "pinned", text: before[row.key] ?? "" }));
    cells.push(el("td", { class: "chapter", text: chapter[row.key] || "" }));
    tbody.append(el("tr", { "data-key": row.key }, ...cells));
  }
  plotResults(r);
}

// Pin `run` (a state.last record) to compare the next runs with; null unpins.
function pinRun(run) {
  state.pinned = run;
  if (state.last) showResults();
  saveState();
}

function plotResults(r) {
  if (!window.Plotly) {
    showError("#sim-error", "plots unavailable: plotly is not installed (pip install 'kvcargo[ui]')");
    return;
  }
  const pinned = state.pinned && state.pinned !== state.last ? state.pinned : null;
  plotCdf(r.plots.cdf, pinned && { label: pinned.command, cdf: pinned.result.plots.cdf });
  plotLink(r.plots.link);
}

// ------------------------------------------------------------------------------------- errors

const CALC_LABELS = {
  model: "Model", prompt: "Prompt tokens", link: "Link", kv_compress: "Compression", kv_compress_at: "Codec runs",
  kv_keep: "Kept fraction",
  kv_ratio: "Wire ratio", send: "Send", device: "Prefill device", devices_per_instance: "Devices per instance",
};
const SIM_LABELS = Object.fromEntries(SIM_FIELDS.map(([name, label]) => [name, label]));
const quoted = (label) => `“${label}”`;

// The server's message in the page's words: every option it names (`--kv-keep`, `invalid
// kv_keep`) becomes the field's label as the page shows it; returns the text and those fields.
function inPageTerms(message, labels) {
  const fields = new Set();
  const name = (flag) => flag.replaceAll("-", "_");
  let text = message.replace(/--([a-z][a-z0-9-]*)/g, (whole, flag) => {
    if (!(name(flag) in labels)) return whole;
    fields.add(name(flag));
    return quoted(labels[name(flag)]);
  });
  text = text.replace(/\b(invalid|parameter|unknown parameter) ([a-z][a-z0-9_]*)\b/g, (whole, word, field) => {
    if (!(field in labels)) return whole;
    fields.add(field);
    return `${word} ${quoted(labels[field])}`;
  });
  return { text, fields };
}

// Show (err) or clear (null) the error of a card ("calc" or "sim"): the message names the
// fields as the page does, those fields are marked invalid, and every panel the error makes
// stale is greyed out until the next good answer.
function showFieldError(card, err) {
  const labels = card === "calc" ? CALC_LABELS : SIM_LABELS;
  const prefix = card === "calc" ? "#calc-" : "#sim-";
  for (const input of document.querySelectorAll(`${card === "calc" ? "#calc-form" : "#sim-form"} [aria-invalid]`)) {
    input.removeAttribute("aria-invalid");
  }
  const panels = card === "calc" ? ["#calc-panel", "#calc-figure"] : ["#sim-results"];
  if (!err) {
    showError(`${prefix}error`, "");
    for (const p of panels) $(p).classList.remove("stale");
    return;
  }
  const { text, fields } = inPageTerms(err.message, labels);
  if (err.field && err.field in labels) fields.add(err.field);
  for (const field of fields) {
    const input = card === "calc" && field === "send" ? null : $(`${prefix}${field}`);
    if (input) input.setAttribute("aria-invalid", "true");
  }
  showError(`${prefix}error`, text);
  for (const p of panels) $(p).classList.add("stale");
}

// ------------------------------------------------------------------------------ state in the URL

function calcState() {
  const d = state.catalog.defaults.handoff;
  const out = {};
  for (const [key, value] of calcParams()) {
    if (value !== String(d[key] ?? "")) out[key] = value;
  }
  return out;
}

function simState(prefix = "#sim-") {
  const out = {};
  for (const [name] of SIM_FIELDS) {
    const input = $(`${prefix}${name}`);
    if (input.value === "" || (input.validity && input.validity.badInput)) continue;
    if (input.value !== String(simDefault(name))) out[name] = input.value;
  }
  return out;
}

function saveState() {
  if (!state.restored) return;
  const pin = state.pinned ? Object.fromEntries(Object.entries(state.pinned.body).map(([k, v]) => [k, String(v)])) : null;
  writeSharedState({ calc: calcState(), sim: simState(), preset: $("#sim-preset").value, pin });
}

function simBodyOf(values) {
  const body = {};
  for (const [name, , kind] of SIM_FIELDS) {
    if (!(name in values)) continue;
    body[name] = kind === "int" || kind === "float" ? Number(values[name]) : values[name];
  }
  return body;
}

// Put the URL's state into the form (unknown names and values are left out: a select keeps
// only values it offers), then run the pinned configuration, if any, and pin it.
async function restoreState(shared) {
  for (const [key, value] of Object.entries(shared.calc)) {
    if (key === "send") {
      const radio = document.querySelector(`input[name="send"][value="${CSS.escape(value)}"]`);
      if (radio) radio.checked = true;
    } else if (key === "prompt") {
      $("#calc-prompt").value = value;
      $("#calc-prompt-range").value = value;
    } else if (key in CALC_LABELS) {
      setIfOffered($(`#calc-${key}`), value);
    }
  }
  if (shared.preset && state.presets.some((p) => p.key === shared.preset)) {
    $("#sim-preset").value = shared.preset;
    applyPreset(shared.preset);
  } else {
    for (const [name, value] of Object.entries(shared.sim)) if (name in SIM_LABELS) setIfOffered($(`#sim-${name}`), value);
  }
  state.restored = true;
  updateCalculator();
  if (shared.pin) {
    const run = await runSimulation(simBodyOf(shared.pin));
    if (run) pinRun(run);
  }
}

function setIfOffered(input, value) {
  if (input.tagName === "SELECT" && ![...input.options].some((o) => o.value === value)) return;
  input.value = value;
}

// ---------------------------------------------------------------------------------------- start

async function main() {
  const shared = readSharedState();
  try {
    const [cat, presets] = await Promise.all([api("/api/catalog"), api("/api/presets")]);
    state.catalog = cat;
    state.presets = presets;
    setupCalculator(cat);
    setupSimulator(cat, presets);
  } catch (err) {
    showError("#load-error", `cannot load the page's data: ${err.message}`);
    for (const card of document.querySelectorAll(".card")) card.classList.add("stale");
    return;
  }
  const pinning = restoreState(shared);
  document.body.dataset.ready = "1";
  await pinning;
}

main();
