// The page: a form -> a vram-estimate command line -> the CLI's own `main` (web/bridge.py in Pyodide) -> its
// --json answer, drawn. No number is computed here; the page only formats the CLI's bytes as GiB (2 decimals, as
// the CLI prints them) and sums nothing it does not label. State lives in the URL's hash, so a link reproduces an
// answer. Python (Pyodide + the estimator) runs in web/worker.js, off this thread.

const T0 = performance.now(); // the module started; performance.now() itself counts from navigation start
const $ = (id) => document.getElementById(id);
const form = $("form");
const GIB = 2 ** 30;
const DEFAULTS = { advice: "1" }; // every other field: empty = the CLI's default (or what a config file sets)
const FILE_KEY = "file:"; // hash keys of config files: file:NAME=base64url(text)
const NEAR_KEY = "near:"; // files only placed in the folder, read by another file (near:NAME=base64url(text))

// ---------- formatting: Python's f"{x:.2f}" (round half to even on exact ties, as CPython does) ----------
function fixed2(x) {
  const y = x * 100;
  if (Number.isFinite(y) && Number.isInteger(y * 2) && !Number.isInteger(y)) {
    const n = Math.floor(y);
    const even = n % 2 === 0 ? n : n + 1;
    return (even / 100).toFixed(2);
  }
  const s = x.toFixed(2);
  return s === "-0.00" ? "-0.00" : s;
}
const gib = (bytes) => fixed2(bytes / GIB);

// ---------- state: form <-> object <-> URL hash ----------
const files = new Map(); // name -> {text, config}: config files are given as --config NAME, the others are only
// in the folder, for a file that names them (an accelerate YAML's deepspeed_config_file)
let linkNote = null; // a part of the link that could not be read

function readForm() {
  const st = {};
  for (const el of form.elements) {
    if (!el.name) continue;
    st[el.name] = el.type === "checkbox" ? (el.checked ? "1" : "0") : el.value.trim();
  }
  return st;
}

function writeForm(st) {
  for (const el of form.elements) {
    if (!el.name) continue;
    const v = st[el.name] ?? DEFAULTS[el.name] ?? "";
    if (el.type === "checkbox") el.checked = v === "1";
    else el.value = v;
  }
  if (st.modelcfg) $("modelcfg-box").open = true;
  showVllmFields();
}

function b64e(s) {
  let bin = "";
  for (const b of new TextEncoder().encode(s)) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
function b64d(s) {
  s = s.replace(/-/g, "+").replace(/_/g, "/");
  while (s.length % 4) s += "=";
  return new TextDecoder().decode(Uint8Array.from(atob(s), (c) => c.charCodeAt(0)));
}

function toHash(st) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(st)) {
    if (v === "" || v === (DEFAULTS[k] ?? "")) continue;
    p.set(k, k === "modelcfg" ? b64e(v) : v);
  }
  for (const [name, f] of files) p.set((f.config ? FILE_KEY : NEAR_KEY) + name, b64e(f.text));
  return p.toString();
}

function fromHash(hash) {
  const p = new URLSearchParams(hash.replace(/^#/, ""));
  const st = {};
  files.clear();
  linkNote = null;
  for (const [k, v] of p) {
    try {
      if (k.startsWith(FILE_KEY)) files.set(k.slice(FILE_KEY.length), { text: b64d(v), config: true });
      else if (k.startsWith(NEAR_KEY)) files.set(k.slice(NEAR_KEY.length), { text: b64d(v), config: false });
      else st[k] = k === "modelcfg" ? b64d(v) : v;
    } catch {
      linkNote = `this link's ${k} could not be decoded (not base64url text); it was left out`;
    }
  }
  return st;
}

// ---------- the command line the form stands for ----------
const NUMBER_FLAGS = [
  ["lora_r", "--lora-r"],
  ["gens", "--num-generations"],
  ["bs", "--per-device-train-batch-size"],
  ["ga", "--gradient-accumulation-steps"],
  ["prompt", "--max-prompt-length"],
  ["completion", "--max-completion-length"],
  ["beta", "--beta"],
  ["gpus", "--gpus"],
];
const METHOD = {
  full: ["--no-use-peft", "--no-load-in-4bit"],
  lora: ["--use-peft", "--no-load-in-4bit"],
  qlora: ["--qlora"],
};
const VLLM = {
  off: ["--no-use-vllm"],
  colocate: ["--use-vllm", "--vllm-mode", "colocate"],
  server: ["--use-vllm", "--vllm-mode", "server"],
};

function argvOf(st) {
  const a = [];
  if (st.modelcfg) a.push("--model", "model/config.json");
  else if (st.model) a.push("--model", st.model);
  if (METHOD[st.method]) a.push(...METHOD[st.method]);
  if (st.targets) a.push("--lora-target-modules", ...st.targets.split(/\s+/).filter(Boolean));
  if (st.dtype) a.push("--dtype", st.dtype);
  if (st.ckpt === "on") a.push("--gradient-checkpointing");
  if (st.ckpt === "off") a.push("--no-gradient-checkpointing");
  if (st.optim) a.push("--optim", st.optim);
  if (VLLM[st.vllm]) a.push(...VLLM[st.vllm]);
  if (st.vllm === "colocate" && st.vutil) a.push("--vllm-gpu-memory-utilization", st.vutil);
  if (st.vllm === "server" && st.vsgpus) a.push("--vllm-server-gpus", st.vsgpus);
  if (st.vllm === "server" && st.vsutil) a.push("--vllm-server-utilization", st.vsutil);
  for (const [k, flag] of NUMBER_FLAGS) if (st[k]) a.push(flag, st[k]);
  if (st.sharding) a.push("--sharding", st.sharding);
  if (st.gpu) a.push("--gpu", st.gpu);
  if (st.solve) a.push("--solve", st.solve);
  if (st.advice === "1") a.push("--advice");
  for (const [name, f] of files) if (f.config) a.push("--config", name);
  return a;
}

function filesOf(st) {
  const out = Object.fromEntries([...files].map(([name, f]) => [f.config ? name : placeOf(name), f.text]));
  if (st.modelcfg) out["model/config.json"] = st.modelcfg;
  return out;
}

const shq = (w) => (/^[\w@%+=:,./-]+$/.test(w) ? w : "'" + w.replace(/'/g, "'\\''") + "'");

// ---------- Python, in the worker ----------
const timing = { module_ms: T0 };
const worker = new Worker(new URL("worker.js", import.meta.url), { type: "module" });
let ready = false;
let nextId = 0;
const waiting = new Map(); // request id -> resolve

worker.onmessage = (e) => {
  const m = e.data;
  if (m.stage === "python") timing.pyodide_ms = performance.now();
  else if (m.ready) {
    timing.import_ms = performance.now();
    ready = true;
    window.vramPage.ready = true;
    answer();
  } else if (m.bootError) bootFailed(m.bootError);
  else if (waiting.has(m.id)) {
    waiting.get(m.id)(m.result);
    waiting.delete(m.id);
  }
};
worker.onerror = (e) => bootFailed(e.message || "the worker could not start");

function bootFailed(msg) {
  $("status").hidden = false;
  $("status").textContent = `Could not start Python in this browser: ${msg}`;
  $("status").className = "status error";
  window.vramPage.bootError = msg;
  window.dispatchEvent(new CustomEvent("vram-answer", { detail: { bootError: msg } }));
}

function cli(argv, st) {
  const id = ++nextId;
  return new Promise((resolve) => {
    waiting.set(id, resolve);
    worker.postMessage({ id, argv, extra: st.extra, files: filesOf(st) });
  });
}

fetch("choices.json")
  .then((r) => (r.ok ? r.json() : null))
  .then((c) => {
    if (!c) return;
    $("models").replaceChildren(...c.models.map((m) => new Option(m)));
    $("gpus").replaceChildren(...c.gpus.map((g) => new Option(g)));
  })
  .catch(() => {});

// ---------- answering: one CLI run at a time, always for the form's latest state ----------
let seq = 0;
let running = false;
let again = false;

async function answer() {
  if (!ready) return;
  if (running) {
    again = true; // answered once the current run ends
    return;
  }
  running = true;
  try {
    const st = readForm();
    const argv = argvOf(st);
    const hash = location.hash;
    const key = requestKey(st);
    const t = performance.now();
    const r = await cli([...argv, "--json"], st);
    const ms = performance.now() - t;
    if (again || requestKey(readForm()) !== key) {
      again = true; // the form changed meanwhile: this answer is stale, answer the new state instead
      return;
    }
    let data = null;
    if (r.stdout.trim()) {
      try { data = JSON.parse(r.stdout); } catch { data = null; }
    }
    const shown = render(st, r, data);
    $("answer").classList.remove("busy");
    if (timing.first_answer_ms === undefined) timing.first_answer_ms = performance.now();
    timing.last_answer_ms = ms;
    showTiming();
    lastRun = { argv, st };
    if ($("text-box").open) showText();
    const detail = { seq: ++seq, hash, argv: r.argv, code: r.code, stderr: r.stderr, data, shown, ms };
    window.vramPage.last = detail;
    window.dispatchEvent(new CustomEvent("vram-answer", { detail }));
  } finally {
    running = false;
    if (again) {
      again = false;
      answer();
    }
  }
}

function requestKey(st) {
  return JSON.stringify([argvOf(st), st.extra, filesOf(st)]);
}

// The CLI's text report for the same command line: run when its panel is open (it costs a second run).
let lastRun = null;
async function showText() {
  if (!lastRun || !ready) return;
  const run = lastRun;
  const r = await cli(run.argv, run.st);
  if (run === lastRun) $("text").textContent = r.stdout + (r.stderr ? "\n" + r.stderr : "");
}
$("text-box").addEventListener("toggle", () => { if ($("text-box").open) showText(); });

function showTiming() {
  const s = (ms) => (ms / 1000).toFixed(2) + " s";
  $("timing").textContent =
    `first answer ${s(timing.first_answer_ms)} after navigation (Python ready ${s(timing.pyodide_ms)}, ` +
    `estimator imported ${s(timing.import_ms)}); this answer ${Math.round(timing.last_answer_ms)} ms, measured in this browser`;
}

function errorLine(stderr) {
  const lines = stderr.trim().split("\n").filter(Boolean);
  return lines.find((l) => l.includes(": error: ")) || lines[lines.length - 1] || "(no message)";
}

function render(st, r, d) {
  $("status").hidden = true;
  const err = $("error");
  const shown = {};
  if (!d) {
    err.hidden = false;
    // the CLI's one error line; --help / --version print to stdout instead, shown as they are
    err.textContent = r.stderr.trim() ? errorLine(r.stderr) : r.stdout.trim() || `exit code ${r.code}, no output`;
    shown.error = err.textContent;
    $("verdict").hidden = true;
    $("result").hidden = true;
    return shown;
  }
  err.hidden = true;
  $("result").hidden = false;
  const v = $("verdict");
  v.hidden = false;
  const line = verdictLine(d);
  v.textContent = line.text;
  v.className = "verdict " + line.cls;
  shown.verdict = line.text;

  $("model-line").textContent = `${d.model.name}: ${d.model.params.toLocaleString("en")} params, ${d.model.trainable_params.toLocaleString("en")} trainable (${d.source})`;
  $("settings-line").textContent = settingsLine(d.config);

  shown.need = drawNeed(d);
  shown.phases = drawPhases(d);
  shown.fits = drawFits(d);
  shown.advice = drawAdvice(d);
  drawLayout(d);
  drawSolve(d);
  const notes = [...r.stderr.trim().split("\n").filter(Boolean), ...(d.notes || [])];
  $("notes").replaceChildren(...notes.map((n) => li(n)));
  if (linkNote) $("notes").prepend(li(linkNote));
  const b = d.band;
  $("band").textContent = b
    ? `error band (regime ${b.regime}): ${(b.low * 100).toFixed(1)}% / +${(b.high * 100).toFixed(1)}% on ${b.n} off-grid traces (${b.source}); fits are decided with the estimate raised by ${(b.margin * 100).toFixed(1)}%`
    : "";
  const names = Object.keys(filesOf(st));
  $("cmd").textContent =
    (names.length ? `# files: ${names.join(", ")} (in the current folder)\n` : "") +
    ["vram-estimate", ...r.argv.filter((w) => w !== "--json")].map(shq).join(" ");
  $("json").textContent = r.stdout;
  return shown;
}

function li(text, cls) {
  const e = document.createElement("li");
  e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function verdictLine(d) {
  // The CLI's own first line (the JSON's `verdict`, written by report.verdict); the browser test checks it
  // against the first line of the CLI's text answer.
  const t = d.target;
  const layoutBad = d.layout && !d.layout.fits;
  const ok = (d.fits || []).some((f) => f.fits);
  const cls = t ? (t.fits ? "ok" : "bad") : (layoutBad || !ok ? "bad" : "info");
  return { text: d.verdict, cls };
}

function settingsLine(c) {
  // the settings that move memory most, from the JSON's config (what the CLI resolved, flags and files together)
  if (!c) return "";
  const method = c.load_in_4bit ? "QLoRA" : c.use_peft ? `LoRA r=${c.lora_r}` : "full fine-tune";
  const parts = [`dtype ${c.dtype}${c.bf16 ? " + bf16 autocast" : ""}`, method, `gens ${c.num_generations}`,
    `bs ${c.per_device_train_batch_size}`, `GA ${c.gradient_accumulation_steps}`,
    `prompt ${c.max_prompt_length} + completion ${c.max_completion_length} tokens`,
    `grad ckpt ${c.gradient_checkpointing ? "on" : "off"}`, c.optim];
  if (c.beta) parts.push(`beta ${c.beta}`);
  if (c.use_vllm) {  // report.vllm_words: a server's share is trl vllm-serve's, of its own GPUs
    const server = `vLLM server ${c.vllm_server_utilization} on ${c.vllm_server_gpus} GPU${c.vllm_server_gpus > 1 ? "s" : ""} of its own`;
    parts.push(c.vllm_mode === "server" ? server : `vLLM ${c.vllm_mode} ${c.vllm_gpu_memory_utilization}`);
  }
  if (c.num_gpus > 1) parts.push(`${c.num_gpus} GPUs ${c.sharding}`);
  parts.push(`TRL ${c.trl_version}`);
  return "settings: " + parts.join(", ");
}

// ---------- charts: plain SVG ----------
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#8c564b", "#17becf", "#bcbd22"];
const colors = new Map();
function colorOf(name) {
  if (!colors.has(name)) colors.set(name, PALETTE[colors.size % PALETTE.length]);
  return colors.get(name);
}
const svgNS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function needSegments(d) {
  // What the card must hold = the peak phase's tensors + the allocator's reserve (release-and-retry) + the items
  // outside the tensors; + the error band = what each GPU is compared with (fit_bytes). All from the JSON.
  const segs = [];
  for (const [comp, b] of Object.entries((d.phases || {})[d.peak_phase] || {})) if (b) segs.push({ name: comp, bytes: b, source: d.source, color: colorOf(comp) });
  const L = d.layers || {};
  if (L.need && L.need.allocator_extra_bytes) {
    // the fitted models' safety margin (their worst leave-one-out miss) apart from their expected reserve
    const margin = Math.min(L.need.allocator_margin_bytes || 0, L.need.allocator_extra_bytes);
    segs.push({ name: "allocator reserve (release-and-retry)", bytes: L.need.allocator_extra_bytes - margin, source: L.need.source, color: "#9aa5b1" });
    if (margin) segs.push({ name: "reserve margin (safe side)", bytes: margin, source: `${L.need.source} (worst leave-one-out miss)`, color: "#cfd5dc", hatch: true });
  }
  for (const i of [...(L.in_reserved || []), ...(L.outside_allocator || [])]) segs.push({ name: i.name, bytes: i.bytes, source: `${i.source} (${i.basis})`, color: "#c9ced6" });
  if (d.band_bytes) segs.push({ name: "error band (safe side)", bytes: d.band_bytes, source: "traced (estimator/band.py)", color: "#f3d9a4", hatch: true });
  const sum = segs.reduce((s, x) => s + x.bytes, 0);
  const total = d.fit_bytes ?? d.peak_device_bytes;
  if (total - sum > 0) segs.push({ name: "other (the JSON's total minus the parts above)", bytes: total - sum, source: d.source, color: "#e0e0e0" });
  return { segs, total };
}

function drawNeed(d) {
  const { segs, total } = needSegments(d);
  const target = d.target;
  const max = Math.max(total, target ? target.usable_bytes : 0);
  const W = 760, X0 = 10, BW = W - 20, H = 70;
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": "what the card must hold" });
  let x = X0;
  for (const s of segs) {
    const w = (s.bytes / max) * BW;
    const r = el("rect", { x, y: 18, width: Math.max(w, 0.5), height: 26, fill: s.color, stroke: "#fff", "stroke-width": 0.5 });
    r.appendChild(el("title", {}, `${s.name}: ${gib(s.bytes)} GiB, ${s.source}`));
    svg.appendChild(r);
    x += w;
  }
  svg.appendChild(el("text", { x: X0, y: 12, class: "lbl" }, `${gib(total)} GiB: what each GPU is compared with (estimated, band included)`));
  if (target) {
    const tx = X0 + (target.usable_bytes / max) * BW;
    svg.appendChild(el("line", { x1: tx, x2: tx, y1: 14, y2: 50, stroke: target.fits ? "#2e7d32" : "#c62828", "stroke-width": 2 }));
    svg.appendChild(el("text", { x: Math.min(tx, W - 10), y: 64, class: "lbl", "text-anchor": "end" }, `${target.gpu}: ${gib(target.usable_bytes)} GiB torch can use`));
  }
  $("chart-need").replaceChildren(svg, legend(segs));
  return { total: gib(total), parts: segs.map((s) => [s.name, gib(s.bytes)]) };
}

function legend(segs) {
  const ul = document.createElement("ul");
  ul.className = "legend";
  for (const s of segs) {
    const item = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "sw";
    sw.style.background = s.color;
    item.append(sw, `${s.name} `, Object.assign(document.createElement("b"), { textContent: gib(s.bytes) + " GiB" }), ` ${s.source}`);
    ul.appendChild(item);
  }
  return ul;
}

function drawPhases(d) {
  const phases = Object.entries(d.phases || {});
  const totals = d.phase_totals || {};
  const max = Math.max(1, ...Object.values(totals));
  const W = 760, LW = 90, BW = W - LW - 110, RH = 26;
  const svg = el("svg", { viewBox: `0 0 ${W} ${phases.length * RH + 8}`, width: "100%", role: "img", "aria-label": "tensor bytes per phase" });
  const shown = {};
  phases.forEach(([ph, comps], i) => {
    const y = 4 + i * RH;
    const peak = ph === d.peak_phase;
    svg.appendChild(el("text", { x: LW - 6, y: y + 16, "text-anchor": "end", class: peak ? "lbl peak" : "lbl" }, ph + (peak ? " *" : "")));
    let x = LW;
    for (const [comp, b] of Object.entries(comps)) {
      if (!b) continue;
      const w = (b / max) * BW;
      const r = el("rect", { x, y: y + 3, width: Math.max(w, 0.5), height: RH - 8, fill: colorOf(comp), stroke: "#fff", "stroke-width": 0.5 });
      r.appendChild(el("title", {}, `${ph} / ${comp}: ${gib(b)} GiB, ${d.source}`));
      svg.appendChild(r);
      x += w;
    }
    svg.appendChild(el("text", { x: x + 6, y: y + 16, class: peak ? "lbl peak" : "lbl" }, `${gib(totals[ph] ?? 0)} GiB`));
    shown[ph] = gib(totals[ph] ?? 0);
  });
  const comps = [...new Set(phases.flatMap(([, c]) => Object.keys(c)))];
  const ul = document.createElement("ul");
  ul.className = "legend";
  for (const c of comps) {
    const item = document.createElement("li");
    const sw = document.createElement("span");
    sw.className = "sw";
    sw.style.background = colorOf(c);
    item.append(sw, c);
    ul.appendChild(item);
  }
  const note = document.createElement("p");
  note.className = "muted";
  note.textContent = `* peak phase: ${d.peak_phase}; peak allocated ${gib(d.peak_allocated_bytes)} GiB, peak reserved ${gib(d.peak_reserved_bytes)} GiB, "nvidia-smi" peak ${gib(d.peak_device_bytes)} GiB (estimated)`;
  $("chart-phases").replaceChildren(svg, ul, note);
  return shown;
}

function drawFits(d) {
  const rows = [...(d.fits || [])].sort((a, b) => a.gpu_memory_bytes - b.gpu_memory_bytes);
  const tb = document.querySelector("#fits tbody");
  const shown = [];
  tb.replaceChildren(
    ...rows.map((f) => {
      const tr = document.createElement("tr");
      tr.className = f.fits ? "ok" : "bad";
      if (d.target && d.target.gpu === f.gpu) tr.classList.add("target");
      const amount = f.free_bytes >= 0 ? `+${gib(f.free_bytes)} GiB free` : `-${gib(-f.free_bytes)} GiB missing`;
      const cells = [f.gpu, `${gib(f.usable_bytes)} GiB`, amount, (f.fits ? "✓ fits" : "✗ does not fit") + (f.blocked ? ` (fails at ${f.blocked})` : "")];
      for (const c of cells) tr.appendChild(Object.assign(document.createElement("td"), { textContent: c }));
      tr.title = `${f.compared}; GPU memory: ${f.gpu_memory_source}; torch can use: ${f.usable_source}`;
      shown.push(cells);
      return tr;
    }),
  );
  return shown;
}

// "saves X GiB", or "adds X GiB" for a change that needs more (report._saves)
const saves = (o) => `${o.saved_bytes >= 0 ? "saves" : "adds"} ${gib(Math.abs(o.saved_bytes))} GiB`;

function drawAdvice(d) {
  const a = d.advice;
  $("advice-box").hidden = !a;
  if (!a) return null;
  const items = a.singles.map((o) => {
    const mark = o.fits === null || o.fits === undefined ? "" : o.fits ? "✓ fits: " : "✗ ";
    // where vLLM fails at start-up as given, each change says whether vLLM then starts (report._start_mark)
    const start = a.baseline_starts === false && o.starts !== undefined ? (o.starts ? " (vLLM starts)" : " (vLLM still fails at start-up)") : "";
    return `${mark}${o.changes.map((c) => c.label).join(" + ")}${start} — ${saves(o)} → the card must hold ${gib(o.need_bytes)} GiB` + (o.cost ? `; cost: ${o.cost}` : "");
  });
  $("advice").replaceChildren(...(items.length ? items.map((t, i) => li(t, a.singles[i].fits ? "ok" : "")) : [li("no single change saves memory at this configuration")]));
  let plan = "";
  if (a.budget_bytes !== null && (a.baseline_bytes > a.budget_bytes || a.baseline_starts === false)) {
    const tail = (o) => `${o.changes.map((c) => c.label).join(" + ")} → ${gib(o.need_bytes)} GiB, ${saves(o)} (estimated)`;
    plan = a.plan && a.plan.fits ? `smallest set that fits: ${tail(a.plan)}` : a.plan ? `nothing tried fits; closest: ${tail(a.plan)}` : "nothing tried fits";
  }
  $("plan").textContent = plan;
  return { items, plan };
}

function drawLayout(d) {
  const L = d.layout;
  $("layout-box").hidden = !L;
  if (!L) return;
  const out = [`${L.total_gpus} GPU(s); ${L.fits ? "fits" : "does NOT fit"} (estimated)`];
  for (const g of L.groups) {
    // layout.py's GpuGroup.fits: what the GPU must hold (training: need_bytes, else the peak) <= total
    const held = g.need_bytes ?? g.peak_device_bytes;
    const verdict = held <= g.total_bytes ? "fits" : `does NOT fit, ${gib(held - g.total_bytes)} GiB missing`;
    const what = g.need_bytes == null ? `peak ${gib(g.peak_device_bytes)}` : `must hold ${gib(g.need_bytes)} (nvidia-smi peak ${gib(g.peak_device_bytes)})`;
    out.push(`${g.name} × ${g.count}: ${what} of ${gib(g.total_bytes)} GiB (${verdict})`);
    for (const r of g.roles) out.push(`   ${r.role}: resident ${gib(r.resident)} + working ${gib(r.working)} GiB`);
  }
  const v = L.vllm;
  if (v) {
    out.push(`vLLM ${v.mode}: request ${v.utilization} × total = ${gib(v.requested)} GiB: weights ${gib(v.weights)}, KV cache ${gib(v.kv_cache)} (${v.kv_tokens} tokens), CUDA graphs ${gib(v.cuda_graphs)}; one max_model_len=${v.max_model_len} request needs ${gib(v.one_sequence)} GiB of KV cache`);
    if (v.smallest_utilization !== null || v.largest_safe_utilization !== null) out.push(`${v.mode === "server" ? "trl vllm-serve --gpu_memory_utilization" : "vllm_gpu_memory_utilization"} that works: from ${v.smallest_utilization ?? "none"} (one request fits) to ${v.largest_safe_utilization ?? "none"} (${v.mode === "server" ? "free at start-up and for the weight push" : "step fits"})`);
    // report.py's _vllm_outcome: a server that starts can still run out when the trainer pushes weights
    const pushOver = L.groups.some((g) => g.name === "vLLM server" && (g.need_bytes ?? g.peak_device_bytes) > g.total_bytes);
    const outcome = v.failure !== null ? "fails at " + v.failure : pushOver ? "starts, then its GPU runs out when the trainer pushes weights" : "starts and runs";
    out.push(`vLLM verdict: ${outcome}`);
  }
  for (const n of L.notes || []) out.push(`note: ${n}`);
  for (const f of L.fixes || []) out.push(`fix: ${f}`);
  $("layout").replaceChildren(...out.map((t) => Object.assign(document.createElement("div"), { textContent: t })));
}

function drawSolve(d) {
  const s = d.solve;
  $("solve-box").hidden = !s;
  if (!s) return;
  $("solve").textContent = s.value === null
    ? `${s.knob}: nothing fits in ${gib(s.budget_bytes)} GiB, even the smallest value (estimated)`
    : `largest ${s.knob} that fits = ${s.value} (must hold ${gib(s.need_bytes || 0)} of the ${gib(s.budget_bytes)} GiB torch can use, estimated${s.note ? "; " + s.note : ""})`;
}

// ---------- files: drop, pick, paste ----------
// A file another file names (an accelerate YAML's deepspeed_config_file: zero3.json) is only put beside it, as
// the CLI reads it through that file; every other file is given as --config. Each file's box switches it.
function namedByAnother(name) {
  return [...files].some(([other, f]) => other !== name && nameRe(name).test(f.text));
}

function nameRe(name) {
  const esc = name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`(?:^|[\\s'"=:])((?:[\\w.\\-]+/)*)${esc}(?=['"\\s,]|$)`, "m");
}

// where a file only read through another one goes: the relative path that file names it by (accelerate opens
// deepspeed_config_file from the working directory), else beside it
function placeOf(name) {
  for (const [other, f] of files) {
    const m = other !== name && nameRe(name).exec(f.text);
    if (m && m[1] && !m[1].startsWith("/") && !m[1].split("/").includes("..")) return m[1] + name;
  }
  return name;
}

function addFile(name, text) {
  name = name.split(/[\\/]/).pop() || "config.yaml";
  files.set(name, { text, config: true });
  for (const [n, f] of files) f.config = !namedByAnother(n);
  drawFiles();
  changed();
}

function drawFiles() {
  $("file-list").replaceChildren(
    ...[...files].map(([name, f]) => {
      const item = li("");
      const box = Object.assign(document.createElement("input"), { type: "checkbox", checked: f.config, title: "give it as --config" });
      box.onchange = () => { f.config = box.checked; drawFiles(); changed(); };
      const what = f.config ? `--config ${name}` : `${placeOf(name)} (read through the file that names it)`;
      const code = Object.assign(document.createElement("code"), { textContent: what });
      const rm = Object.assign(document.createElement("button"), { type: "button", textContent: "remove" });
      rm.onclick = () => { files.delete(name); drawFiles(); changed(); };
      const label = document.createElement("label");
      label.className = "check inline";
      label.append(box, code);
      item.append(label, ` (${f.text.split("\n").length} lines) `, rm);
      return item;
    }),
  );
}

async function takeFiles(list) {
  for (const f of list) addFile(f.name, await f.text());
}

document.addEventListener("dragover", (e) => { e.preventDefault(); document.body.classList.add("dragging"); });
document.addEventListener("dragleave", () => document.body.classList.remove("dragging"));
document.addEventListener("drop", (e) => {
  e.preventDefault();
  document.body.classList.remove("dragging");
  takeFiles(e.dataTransfer.files);
});
$("file-pick").addEventListener("change", (e) => { takeFiles(e.target.files); e.target.value = ""; });
$("paste-add").addEventListener("click", () => {
  const text = $("paste-text").value;
  if (!text.trim()) return;
  addFile($("paste-name").value.trim() || "config.yaml", text);
  $("paste-text").value = "";
});

// ---------- wiring ----------
function showVllmFields() {
  const mode = form.elements.vllm.value;
  for (const e of form.querySelectorAll("[data-show]")) e.hidden = e.dataset.show !== mode;
}

let timer = null;
function changed() {
  showVllmFields();
  const h = toHash(readForm());
  history.replaceState(null, "", h ? "#" + h : location.pathname + location.search);
  clearTimeout(timer);
  $("answer").classList.add("busy");
  timer = setTimeout(answer, 80);
}
form.addEventListener("input", changed);
form.addEventListener("change", changed);
window.addEventListener("hashchange", () => {
  writeForm(fromHash(location.hash));
  drawFiles();
  answer();
});

window.vramPage = { timing, last: null, ready: false, answer: () => answer() };
writeForm(fromHash(location.hash));
drawFiles();
