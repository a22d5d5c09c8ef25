// sglang-ctxprof live page: reads the /ctx_profile JSON routes of this server and draws them with uPlot.
// Shows ids, lengths and timings only (the routes never carry prompt or output text).
"use strict";
(function () {
  const BASE = location.pathname.replace(/\/ui\/?$/, "");   // "/ctx_profile" (also behind a prefix)
  const REFRESH_MS = 3000;
  const READ_TIMEOUT_MS = 30000;
  const SLOWEST = 20;
  // The phases that add up to a step, as the server's records.leaf_phases: a target forward (a
  // speculative step's verify, a plain step's decode) counts whole where none of its parts was timed
  // (it ran in a CUDA graph whose split was not read), else by its attention / MoE / rest parts.
  const LEAF_ORDER = ["draft", "verify", "verify_attn", "verify_moe", "verify_rest", "draft_extend", "overhead",
    "unattributed", "decode", "decode_attn", "decode_moe", "decode_rest"];
  const SPLIT = { verify: ["verify_attn", "verify_moe", "verify_rest"], decode: ["decode_attn", "decode_moe", "decode_rest"] };
  const isLeaf = (phases, ph) => phases[ph] != null && !(SPLIT[ph] || []).some((c) => phases[c] != null);
  const leavesIn = (all) => LEAF_ORDER.filter((ph) => all.some((phases) => isLeaf(phases, ph)));
  const COLORS = { draft: "#4e79a7", verify: "#d37295", verify_attn: "#e15759", verify_moe: "#f28e2b", verify_rest: "#76b7b2",
    draft_extend: "#59a14f", overhead: "#bab0ac", unattributed: "#9c755f", decode: "#a0cbe8", decode_attn: "#ff9d9a",
    decode_moe: "#ffbe7d", decode_rest: "#86bcb6" };
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];
  const $ = (id) => document.getElementById(id);
  const charts = {};          // name -> uPlot instance (window.ctxprof.charts, read by the tests)
  const state = { profile: null, status: null, slow: [], rid: null, refreshes: 0, lastError: null, ledger: null,
    captures: null, requestCaptures: null };
  window.ctxprof = { charts, state, refresh: () => refresh() };

  const f = (v, d = 2) => (v === null || v === undefined || Number.isNaN(v)) ? "-" : Number(v).toFixed(d);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  function readLimit() {   // AbortSignal.timeout where the browser has it (Chrome 103, Firefox 100, Safari 16)
    if (AbortSignal.timeout) return AbortSignal.timeout(READ_TIMEOUT_MS);
    const c = new AbortController(); setTimeout(() => c.abort(), READ_TIMEOUT_MS); return c.signal;
  }
  async function getJSON(path) {   // a read that has not answered in READ_TIMEOUT_MS fails (a hung server)
    const r = await fetch(BASE + path, { headers: { Accept: "application/json" }, cache: "no-store", signal: readLimit() });
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    return { status: r.status, body };
  }

  function failed(r, path) {   // why a read gave nothing to show, or null when it answered
    if (r.status === 200) return null;
    const why = r.body && typeof r.body.error === "string" ? ": " + r.body.error : "";
    return `could not load ${path}: HTTP ${r.status}${why}`;
  }

  function message(text, isError) {
    const m = $("msg");
    m.hidden = !text;
    m.textContent = text || "";
    m.className = isError ? "error" : "";
  }

  function width(el) { return Math.max(320, el.clientWidth - 4); }

  function draw(name, el, opts, data) {
    if (charts[name]) { charts[name].destroy(); delete charts[name]; }
    el.textContent = "";
    opts.width = width(el);
    opts.height = opts.height || 240;
    charts[name] = new uPlot(opts, data, el);
  }

  // ---- charts ---------------------------------------------------------------------------------------
  function bucketAxis(labels) {
    return { values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) && labels[t] !== undefined) ? labels[t] : ""),
      splits: () => labels.map((_, i) => i), rotate: 0, size: 40 };
  }

  function phaseChart(p) {
    const bs = p.buckets;
    const present = leavesIn(bs.map((b) => b.phases));
    const labels = bs.map((b) => b.label);
    const x = bs.map((_, i) => i);
    // stacked bars: series hold cumulative sums, drawn top-down so each lower phase paints over
    const raw = present.map((ph) => bs.map((b) => (isLeaf(b.phases, ph) ? b.phases[ph].mean_ms : 0)));
    const cum = []; let acc = bs.map(() => 0);
    raw.forEach((row) => { acc = acc.map((a, i) => a + row[i]); cum.push(acc.slice()); });
    const order = present.map((_, i) => i).reverse();
    const bars = uPlot.paths.bars({ size: [0.6, 80] });
    const series = [{ label: "bucket", value: (u, v) => (v === null ? "-" : labels[v]) }].concat(order.map((i) => ({
      label: present[i], fill: COLORS[present[i]], stroke: COLORS[present[i]], paths: bars, points: { show: false },
      value: (u, v, si, di) => (di === null || di === undefined ? "-" : f(raw[i][di], 3) + " ms"),
    })));
    draw("phases", $("chart-phases"), {
      series, scales: { x: { time: false, range: [-0.6, Math.max(0.6, bs.length - 0.4)] }, y: { range: (u, lo, hi) => [0, hi * 1.08 || 1] } },
      axes: [bucketAxis(labels), { label: "ms per step", size: 56 }], legend: { live: true },
    }, [x].concat(order.map((i) => cum[i])));
  }

  function toksChart(p) {
    const bs = p.buckets.filter((b) => b.steps > 0);
    const fit = (p.fits || {}).step;
    const pts = bs.map((b) => [b.mean_ctx, b.decode_tok_s]).sort((a, b) => a[0] - b[0]);
    // x: the buckets' mean contexts plus a grid for the fitted curve (points are null off the buckets)
    const top = pts.length ? pts[pts.length - 1][0] * 1.1 : 1;
    const grid = Array.from({ length: 41 }, (_, i) => (top * i) / 40);
    const xs = [...new Set(grid.concat(pts.map((q) => q[0])))].sort((a, b) => a - b);
    const at = new Map(pts.map((q) => [q[0], q[1]]));
    let curve = xs.map(() => null);
    let note = "no step-time fit yet (needs steps at two or more contexts)";
    if (fit && fit.n >= 2) {
      const steps = bs.reduce((a, b) => a + b.steps, 0), reqSteps = bs.reduce((a, b) => a + b.req_steps, 0);
      const accepted = bs.reduce((a, b) => a + b.accepted, 0);
      const bsz = steps ? reqSteps / steps : 1, acc = reqSteps ? accepted / reqSteps : 0;
      curve = xs.map((c) => { const ms = fit.intercept_ms + fit.ms_per_1k_ctx * (bsz * c / 1000); return ms > 0 ? acc / (ms / 1000) : null; });
      note = `fit: step ms = ${f(fit.intercept_ms, 3)} + ${f(fit.ms_per_1k_ctx, 4)} × (batch context / 1k tokens), r² ${f(fit.r2, 2)}, n ${fit.n}; ` +
        `curve at mean batch size ${f(bsz, 2)} and ${f(acc, 2)} accepted tokens per step`;
    }
    $("fit-note").textContent = note;
    draw("toks", $("chart-toks"), {
      series: [{ label: "mean ctx" },
        { label: "bucket tok/s", stroke: "#4e79a7", width: 0, paths: () => null, points: { show: true, size: 9, fill: "#4e79a7" }, value: (u, v) => f(v, 1) },
        { label: "fitted", stroke: "#e15759", width: 2, dash: [6, 4], points: { show: false }, value: (u, v) => f(v, 1) }],
      scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, (hi || 1) * 1.1] } },
      axes: [{ label: "context tokens (bucket mean)" }, { label: "tok/s per request", size: 56 }],
    }, [xs, xs.map((x) => (at.has(x) ? at.get(x) : null)), curve]);
  }

  function acceptChart(p) {
    const bs = p.buckets;
    const labels = bs.map((b) => b.label);
    const bars = uPlot.paths.bars({ size: [0.6, 80] });
    draw("accept", $("chart-accept"), {
      series: [{ label: "bucket", value: (u, v) => (v === null ? "-" : labels[v]) },
        { label: "draft budget / step", stroke: "#bab0ac", fill: "#e7e3e0", paths: bars, points: { show: false }, value: (u, v) => f(v, 2) },
        { label: "accepted / step (incl. bonus)", stroke: "#59a14f", fill: "#59a14f", paths: uPlot.paths.bars({ size: [0.35, 50] }), points: { show: false }, value: (u, v) => f(v, 2) }],
      scales: { x: { time: false, range: [-0.6, Math.max(0.6, bs.length - 0.4)] }, y: { range: (u, lo, hi) => [0, (hi || 1) * 1.1] } },
      axes: [bucketAxis(labels), { label: "tokens per request-step", size: 56 }],
    }, [bs.map((_, i) => i), bs.map((b) => b.draft_tokens_per_step), bs.map((b) => b.accepted_per_step)]);
  }

  function positionChart(p) {
    // by each request's own context, every bucket of it (as the text view, Prometheus and the diagnosis)
    const bs = (p.acceptance_by_ctx || []).filter((b) => b.acceptance_by_position && (b.acceptance_by_position.p || []).length);
    $("position-panel").hidden = !bs.length;
    if (!bs.length) { if (charts.position) { charts.position.destroy(); delete charts.position; } return; }
    const k = Math.max(...bs.map((b) => b.acceptance_by_position.p.length));
    const xs = Array.from({ length: k }, (_, i) => i + 1);
    draw("position", $("chart-position"), {
      series: [{ label: "position" }].concat(bs.map((b, j) => ({ label: b.label, stroke: PALETTE[j % PALETTE.length], width: 2, value: (u, v) => f(v, 3) }))),
      scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ label: "draft position i", splits: () => xs }, { label: "P(accepted)", size: 56 }],
    }, [xs].concat(bs.map((b) => xs.map((i) => (b.acceptance_by_position.p[i - 1] ?? null)))));
  }

  // ---- tables ---------------------------------------------------------------------------------------
  function bucketTable(p) {
    const present = leavesIn(p.buckets.map((b) => b.phases));
    const extra = p.buckets.some((b) => b.exec_mode) ? ["exec"] : [];
    $("buckets").tHead.innerHTML = "<tr>" + ["ctx", "steps", "batch", "acc/step", "tok/s", "step ms"].concat(present.map((ph) => ph + " ms"), extra)
      .map((h) => `<th>${esc(h)}</th>`).join("") + "</tr>";
    $("buckets").tBodies[0].innerHTML = p.buckets.map((b) => {
      const em = b.exec_mode ? [Object.entries(b.exec_mode).filter(([k, v]) => typeof v === "number" && v > 0).map(([k, v]) => `${k} ${v}`).join(", ") + (b.exec_mode.downgrade ? " ⚠" : "")] : [];
      const cells = [b.label, b.steps, f(b.mean_batch_size, 1), f(b.accepted_per_step, 2), f(b.decode_tok_s, 1), f(b.phases.step ? b.phases.step.mean_ms : null, 2)]
        .concat(present.map((ph) => f(isLeaf(b.phases, ph) ? b.phases[ph].mean_ms : null, 2)), em);
      return `<tr data-bucket="${esc(b.label)}" data-steps="${b.steps}">` + cells.map((c) => `<td>${esc(c)}</td>`).join("") + "</tr>";
    }).join("") || `<tr><td colspan="6" class="muted">no decode steps recorded yet</td></tr>`;
    $("prefill").textContent = (p.prefill || []).length ? "prefill batches: " + p.prefill.map((q) => `${q.label}: ${q.batches} batches, ${f(q.mean_ms, 1)} ms mean, ${q.cached_tokens ?? 0} prompt tokens cached`).join("; ") : "";
  }

  function slowTable(rows, err) {
    if (err) { $("slow").tBodies[0].innerHTML = `<tr><td colspan="9" class="bad">${esc(err)}</td></tr>`; return; }
    $("slow").tBodies[0].innerHTML = rows.map((r) => `<tr data-rid="${esc(r.rid)}" class="${r.rid === state.rid ? "selected" : ""}">` +
      [r.rid, r.prompt_tokens, r.steps, f(r.decode_tok_s, 1), f(r.accepted_per_step, 2), f(r.decode_ms, 1), f(r.prefill_ms, 1),
        `${r.ctx_first ?? "-"}→${r.ctx_last ?? "-"}`, r.finished ? "yes" : "no"].map((c) => `<td>${esc(c ?? "-")}</td>`).join("") + "</tr>").join("") ||
      `<tr><td colspan="9" class="muted">no finished decode requests yet</td></tr>`;
  }

  function statusTable(st) {
    $("status").tBodies[0].innerHTML = (st.ranks || []).map((r) => {
      if (r.error) return `<tr><td colspan="10" class="bad">${esc(r.error)}</td></tr>`;
      const s = r.status || r;
      const hooks = Object.values(s.hooks || {});
      const ok = hooks.filter((v) => v === "ok").length;
      const deg = s.degraded && s.degraded.components ? Object.keys(s.degraded.components).join(", ") : "";
      const c = s.cost;
      const pct = c ? (c.total_share ?? c.step_share) : null;  // null: no step timed yet
      const cost = c ? `${pct == null ? "- (no step timed yet)" : f(100 * pct, 2) + "%"} of step (scheduler thread ${f(c.sched_us_per_step, 1)} µs/step, drain ${f(c.drain_us_per_record, 0)} µs/record)` : "-";
      const rank = s.rank ? `tp${s.rank.tp}-dp${s.rank.dp}-pp${s.rank.pp}` : "-";
      return "<tr>" + [rank, s.pid, s.enabled ? "yes" : "no", s.algorithm, s.timing, s.submitted, s.dropped, `${ok}/${hooks.length} ok`]
        .map((v) => `<td>${esc(v ?? "-")}</td>`).join("") + `<td class="${deg ? "bad" : ""}">${esc(deg || "none")}</td><td>${esc(cost)}</td></tr>`;
    }).join("");
  }

  function diagnosis(d) {
    const box = $("diagnosis");
    if (!d || d.status !== 200 || !d.body || typeof d.body.headline !== "string") { box.hidden = true; return; }
    box.hidden = false;
    $("diag-headline").textContent = d.body.headline;
    $("diag-flags").innerHTML = (d.body.flags || []).map((fl) => `<li><span class="flag-kind">${esc(fl.kind)}</span>${esc(fl.message)}</li>`).join("");
    ledger(d.body.ledger);
  }

  // The speculation ledger against the plain-decode reference: every number is the route's own
  // (diagnosis.ledger), formatted, never recomputed.  state.ledger holds what is drawn.
  const LEDGER_HEAD = ["ctx", "AL", "spec ms", "plain ms", "speedup", "saved ms", "draft ms", "draft ext ms",
    "verify extra ms", "overhead extra ms", "net ms / token", "verify attn ×", "MoE ×"];
  function ledgerRows(led) {
    return (led.rows || []).map((r) => [r.label, f(r.al, 2), f(r.step_ms, 2), f(r.plain_step_ms, 2) + (r.plain_from === "measured" ? "" : ` (${r.plain_from})`),
      f(r.speedup, 2) + "×", f(r.saved_ms, 2), f(r.spent_ms.draft, 2), f(r.spent_ms.draft_extend, 2), f(r.spent_ms.verify_extra, 2),
      f(r.spent_ms.overhead_extra, 2), f(r.net_per_token_ms, 2), f(r.verify_inflation, 2), f(r.moe_inflation, 2)]);
  }
  function ledger(led) {
    const box = $("ledger-box");
    if (!led) { box.hidden = true; state.ledger = null; return; }
    box.hidden = false;
    if (!led.available) {
      state.ledger = { available: false, reason: led.reason || "", rows: [] };
      $("ledger-source").textContent = "";
      $("ledger-verdict").textContent = "speculation ledger unavailable: " + (led.reason || "no plain-decode reference");
      $("ledger-verdict").className = "unavailable";
      $("ledger").hidden = true; $("ledger-notes").textContent = "";
      return;
    }
    const rows = ledgerRows(led);
    const c = led.crossover || {};
    const cross = "crossover (speedup < 1): " + (c.ctx !== null && c.ctx !== undefined ? `~${f(c.ctx, 0)} tokens, ${c.how} (${c.note})` : `none (${c.note || "-"})`);
    const notes = [(led.attention || {}).verdict, (led.moe || {}).verdict, cross].filter(Boolean);
    state.ledger = { available: true, head: LEDGER_HEAD, rows, verdict: led.verdict, notes, source: led.plain_source || "" };
    $("ledger-source").textContent = `(per speculative step, against plain decode at the same context: ${led.plain_source || "plain arm"})`;
    $("ledger-verdict").textContent = led.verdict;
    $("ledger-verdict").className = "";
    $("ledger").hidden = false;
    $("ledger").tHead.innerHTML = "<tr>" + LEDGER_HEAD.map((h) => `<th>${esc(h)}</th>`).join("") + "</tr>";
    $("ledger").tBodies[0].innerHTML = rows.map((cells, i) => `<tr data-bucket="${esc(led.rows[i].label)}">` +
      cells.map((x, j) => `<td${j === 4 && led.rows[i].speedup < 1 ? ' class="slower"' : ""}>${esc(x)}</td>`).join("") + "</tr>").join("");
    $("ledger-notes").innerHTML = notes.map((n) => esc(n)).join("<br>");
  }

  // ---- deep captures (collect.capture: CaptureInfo.to_dict, as /status and /requests/{rid} serve them) --
  const RECENT_CAPTURES = 5;   // as views.capture_refs.RECENT: the diagnosis flag lists as many
  function stepsText(ids) {    // as views.capture_refs._steps
    if (!ids.length) return "no steps";
    if (ids.every((v, i) => v === ids[0] + i)) return ids.length > 1 ? `steps ${ids[0]}-${ids[ids.length - 1]}` : `step ${ids[0]}`;
    return "steps " + ids.join(",");
  }
  // the merged timeline is served only for a finished capture (409 before, 404 once deleted)
  const timelineHref = (c) => (c.state === "done" ? `${BASE}/capture/${encodeURIComponent(c.id)}?format=timeline` : null);
  function captureCell(c, href) {
    if (href) return `<a class="timeline" href="${esc(href)}" target="_blank" rel="noopener">timeline</a>`;
    if (c.state === "failed") return `<span class="bad">${esc(c.error || "failed")}</span>`;
    return `<span class="muted">${c.state === "deleted" ? "deleted (byte cap)" : "when done"}</span>`;
  }

  // The newest kept captures over the ranks (a capture is asked of every rank under one id), deleted
  // ones left out as views.capture_refs.recent does.  state.captures holds what is drawn.
  function captures(st) {
    const ranks = ((st && st.ranks) || []).map((r) => ((r && r.status) || r || {}).capture).filter(Boolean);
    const seen = new Set(), all = [];
    ranks.forEach((cap) => (cap.captures || []).forEach((c) => {
      if (c && c.state !== "deleted" && !seen.has(c.id)) { seen.add(c.id); all.push(c); }
    }));
    all.sort((a, b) => (b.requested_ns || 0) - (a.requested_ns || 0));
    const recent = all.slice(0, RECENT_CAPTURES).map((c) => ({ id: c.id, trigger: c.trigger, rid: c.rid || null,
      steps: stepsText(c.step_ids || []), state: c.state, timeline: timelineHref(c), error: c.error || "" }));
    const trig = ranks.length ? Object.entries(ranks[0].triggers || {}).map(([k, v]) => `${k} ${v.on ? "on" : "off"}`) : [];
    const fired = ranks.length ? Object.entries(ranks[0].fired || {}).map(([k, v]) => `${k} ${v}`) : [];
    const triggers = ranks.length ? `automatic triggers: ${trig.join(", ") || "-"}; fired: ${fired.join(", ") || "none"}` : "";
    state.captures = { recent, empty: !recent.length, triggers };
    $("captures").tBodies[0].innerHTML = recent.map((c) => `<tr data-capture="${esc(c.id)}">` +
      `<td>${esc(c.id)}</td><td>${esc(c.trigger)}</td>` +
      `<td>${c.rid ? `<a href="#" data-rid="${esc(c.rid)}">${esc(c.rid)}</a>` : "-"}</td>` +
      [c.steps, c.state].map((v) => `<td>${esc(v)}</td>`).join("") +
      `<td>${captureCell(c, c.timeline)}</td></tr>`).join("");
    $("captures").hidden = !recent.length;
    $("captures-empty").hidden = !!recent.length;
    $("captures-triggers").textContent = triggers;
  }

  // One request's captures (the route's ``captures``), with how many of its kept step rows each covers.
  function requestCaptures(q, rows) {
    const box = $("detail-captures-box");
    const mine = new Set(rows.map((s) => s.step_id));
    const caps = (q.captures || []).map((c) => {
      const ids = c.step_ids || [];
      return { id: c.id, trigger: c.trigger, steps: stepsText(ids), mine: ids.filter((i) => mine.has(i)).length,
        state: c.state, timeline: timelineHref(c), error: c.error || "", ids };
    });
    state.requestCaptures = caps.map(({ ids, ...c }) => c);
    box.hidden = !caps.length;
    $("detail-captures").tBodies[0].innerHTML = caps.map((c) => `<tr data-capture="${esc(c.id)}">` +
      [c.id, c.trigger, `${c.steps} (${c.mine} of this request)`, c.state].map((v) => `<td>${esc(v)}</td>`).join("") +
      `<td>${captureCell(c, c.timeline)}</td></tr>`).join("");
    const by = new Map();
    caps.forEach((c) => c.ids.forEach((i) => { if (!by.has(i)) by.set(i, c.id); }));
    return by;   // step id -> the capture that covered it
  }

  // ---- one request ----------------------------------------------------------------------------------
  // A plain rid (letters, digits, _ . : -) goes in the path, unless a browser would not send it there
  // as it is: a segment of "." or ".." (even written %2E) is a dot segment the URL parser drops, and
  // a forwarder may refuse ".." in a path (a shortened long rid holds ".."); any other rid (SGLang
  // takes any string: "/", "@", spaces) goes by the route's ?rid= form, which carries any rid.
  const plainRid = (rid) => /^[A-Za-z0-9_.:-]+$/.test(rid) && rid !== "." && !rid.includes("..");
  const requestPath = (rid) => (plainRid(rid) ? "/requests/" : "/requests?rid=") + encodeURIComponent(rid);
  let opened = 0;   // the latest drill-down asked for (a click, a close, a reset): an older answer is dropped
  async function openRequest(rid) {
    const mine = ++opened;
    state.rid = rid;
    document.querySelectorAll("#slow tbody tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.rid === rid));
    let r;
    try { r = await getJSON(requestPath(rid)); } catch (e) { r = { status: 0, body: null, error: e.message }; }
    if (mine !== opened) return;
    const box = $("detail");
    box.hidden = false;
    $("detail-rid").textContent = rid;
    if (r.status !== 200 || !r.body) {   // no other request's steps stay under this one's name
      state.requestCaptures = null; $("detail-captures-box").hidden = true;
      $("steps").tHead.innerHTML = ""; $("steps").tBodies[0].innerHTML = ""; waterfall(null);
      if (charts.steps) { charts.steps.destroy(); delete charts.steps; }
      $("detail-head").textContent = "could not load: " +
        (r.error || `HTTP ${r.status} ${(r.body && r.body.error) || (r.body ? "" : "(no JSON answer)")}`); return;
    }
    const q = r.body, rows = q.step_rows || [];
    $("detail-head").textContent = `prompt ${q.prompt_tokens ?? "-"} tokens, prefill ${f(q.prefill_ms, 1)} ms; ${q.steps} decode steps, ` +
      `${q.committed} tokens committed, ${f(q.accepted_per_step, 2)} accepted/step, ${f(q.decode_tok_s, 1)} tok/s; ctx ${q.ctx_first}→${q.ctx_last}` +
      ((q.steps_truncated || q.step_rows_dropped) ? `; ${(q.steps_truncated || 0) + (q.step_rows_dropped || 0)} step rows not kept` : "");
    waterfall(q.waterfall);
    const captured = requestCaptures(q, rows);
    const present = leavesIn(rows.map((s) => s.phases_ms || {}));
    const leaf = (s, ph) => (isLeaf(s.phases_ms || {}, ph) ? s.phases_ms[ph] : null);
    $("steps").tHead.innerHTML = "<tr>" + ["#", "ctx", "batch", "draft", "acc", "com", "step ms"].concat(present.map((p) => p + " ms")).map((h) => `<th>${esc(h)}</th>`).join("") + "</tr>";
    $("steps").tBodies[0].innerHTML = rows.map((s, i) => (captured.has(s.step_id) ?
      `<tr class="captured" title="in deep capture ${esc(captured.get(s.step_id))}">` : "<tr>") + [i + 1, s.ctx_len, s.batch_size, s.draft_tokens, s.accepted, s.committed, f(s.step_ms, 3)]
      .concat(present.map((p) => f(leaf(s, p), 3))).map((c) => `<td>${esc(c)}</td>`).join("") + "</tr>").join("");
    const xs = rows.map((_, i) => i + 1);
    const cum = []; let acc = rows.map(() => 0);
    present.forEach((p) => { acc = acc.map((a, i) => a + (leaf(rows[i], p) || 0)); cum.push(acc.slice()); });
    const order = present.map((_, i) => i).reverse();
    const bars = uPlot.paths.bars({ size: [0.7, 40] });
    draw("steps", $("chart-steps"), {
      height: 200,
      series: [{ label: "step" }].concat(order.map((i) => ({ label: present[i], stroke: COLORS[present[i]], fill: COLORS[present[i]], paths: bars, points: { show: false },
        value: (u, v, si, di) => (di === null || di === undefined ? "-" : f(leaf(rows[di], present[i]), 3) + " ms") }))),
      scales: { x: { time: false, range: [0.4, rows.length + 0.6] }, y: { range: (u, lo, hi) => [0, (hi || 1) * 1.08] } },
      axes: [{ label: "decode step of this request", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] },
        { label: "ms (stacked phases)", size: 56 }],
    }, [xs].concat(order.map((i) => cum[i])));
  }

  function waterfall(w) {
    const el = $("waterfall");
    if (!w || !w.wall_ms) { el.hidden = true; el.textContent = ""; return; }
    // the terms tile the wall time; batch sharing is part of the own steps, so it is said, not drawn
    const parts = Object.entries(w.own_steps_ms || {}).map(([k, v]) => [k, v, COLORS[k] || "#888"])
      .concat([["others' prefill", w.others_prefill_ms, "#b07aa1"], ["other decode steps", w.other_decode_ms, "#edc948"],
               ["host gaps", w.host_gaps_ms, "#555"], ["unaccounted", w.unaccounted_ms, "#ccc"]])
      .filter((p) => p[1] > 0);
    el.hidden = false;
    const share = w.batch_sharing_ms > 0 ? `; of the own steps, ${f(w.batch_sharing_ms, 1)} ms is batch sharing` : "";
    el.title = `wall ${f(w.wall_ms, 1)} ms${share}`;
    el.innerHTML = parts.map(([k, v, c]) => `<div style="flex:${v};background:${c}" title="${esc(k)}: ${f(v, 2)} ms">${esc(k)}</div>`).join("");
  }

  // ---- refresh loop ---------------------------------------------------------------------------------
  // One refresh at a time: a tick while one is waiting starts none; an asked-for refresh (a reset, the
  // tab shown again) runs once more after it, so what it shows is read after the ask.
  let running = null, again = false;
  function refresh() {
    if (running) { again = true; return running; }
    running = (async () => {
      try { do { again = false; await refreshOnce(); } while (again); } finally { running = null; }
    })();
    return running;
  }

  async function refreshOnce() {
    try {
      const [p, st, sl, dg] = await Promise.all([getJSON(""), getJSON("/status"), getJSON(`/requests?slowest=${SLOWEST}`), getJSON("/diagnosis")]);
      if (p.status !== 200) throw new Error(`/ctx_profile answered HTTP ${p.status}: ${(p.body && p.body.error) || ""}`);
      state.profile = p.body; state.status = st.body; state.slow = (sl.body && sl.body.requests) || [];
      const P = p.body;
      $("summary").textContent = `${P.enabled ? "enabled" : "DISABLED"} · ${(P.ranks || []).length} rank(s) · timing ${P.timing || "-"} · ` +
        `${(P.algorithms || []).join(", ") || "-"} · ${P.totals.decode_steps} steps, ${P.totals.prefill_batches} prefill batches · dropped ${P.dropped}` +
        (P.degraded ? " · DEGRADED" : "");
      $("summary").className = P.degraded ? "bad" : "muted";
      phaseChart(P); toksChart(P); acceptChart(P); positionChart(P); bucketTable(P);
      slowTable(state.slow, failed(sl, "/requests"));
      const stErr = failed(st, "/status");  // never an old table that still says "degraded: none"
      if (stErr) $("status").tBodies[0].innerHTML = `<tr><td colspan="10" class="bad">${esc(stErr)}</td></tr>`;
      else { statusTable(st.body); captures(st.body); }
      diagnosis(dg);
      state.refreshes += 1; state.lastError = null;
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      state.lastError = String(e);
      $("updated").textContent = "refresh failed: " + e.message;
    }
  }

  async function reset() {
    const key = $("admin-key").value;
    const headers = { "Content-Type": "application/json" };
    if (key) headers.Authorization = "Bearer " + key;
    let r;
    try { r = await fetch(BASE + "/reset", { method: "POST", headers, body: "{}" }); } catch (e) {
      message(`reset failed: ${e.message} (is the server up?)`, true); return;
    }
    if (r.ok) { message("profile reset", false); closeRequest(); refresh(); return; }
    let why = ""; try { why = (await r.json()).error || ""; } catch (e) { why = ""; }
    message(`reset refused: HTTP ${r.status} ${why}` + (r.status === 401 || r.status === 403 ? " (wrong or missing admin key)" : ""), true);
  }

  $("reset").addEventListener("click", reset);
  $("slow").addEventListener("click", (ev) => { const tr = ev.target.closest("tr[data-rid]"); if (tr) openRequest(tr.dataset.rid); });
  $("captures").addEventListener("click", (ev) => { const a = ev.target.closest("a[data-rid]"); if (a) { ev.preventDefault(); openRequest(a.dataset.rid); } });
  function closeRequest() { opened += 1; state.rid = null; $("detail").hidden = true; }
  $("detail-close").addEventListener("click", closeRequest);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  window.addEventListener("resize", () => Object.entries(charts).forEach(([n, u]) => u.setSize({ width: width(u.root.parentNode), height: u.height })));
  setInterval(() => { if (!document.hidden && !running) refresh(); }, REFRESH_MS);
  refresh();
})();
