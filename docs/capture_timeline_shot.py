"""Screenshot of a merged capture timeline (``GET /ctx_profile/capture/<id>?format=timeline``) in a
real browser, offline.

Neither Perfetto's UI nor ``chrome://tracing`` is available here (Perfetto's UI is a web app at
ui.perfetto.dev; Chromium 156 no longer ships ``chrome://tracing``), so this renders the trace-event
JSON itself: a self-contained HTML page (a canvas flame chart: one track per process/thread, slices
stacked by nesting, each labelled when it is wide enough) that headless Chromium opens through
chromedriver (selenium) and screenshots.

    python docs/capture_timeline_shot.py TIMELINE.json docs/capture-timeline.png [--steps N]

``--first K --steps N``: show N of the capture's steps (our step slices) from the K-th (0-based),
default the first 2.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

PAGE = r"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>ctxprof capture timeline</title>
<style>body{margin:0;font:12px sans-serif;background:#fff}#h{padding:6px 10px;background:#263238;color:#fff}</style>
</head><body><div id="h"></div><canvas id="c"></canvas><script>
const D = __DATA__;
const W = 1580, LEFT = 230, ROW = 15, MAXD = 12;
const t0 = D.t0, t1 = D.t1, sx = (W - LEFT - 10) / (t1 - t0);
const tracks = {};
for (const e of D.events) { const k = e.pid + "/" + e.tid; (tracks[k] = tracks[k] || []).push(e); }
const order = Object.keys(tracks).sort((a, b) => (a.startsWith(D.ours + "/") ? -1 : 0) - (b.startsWith(D.ours + "/") ? -1 : 0));
let rows = [], y = 30;
for (const k of order) {
  const ev = tracks[k].sort((a, b) => a.ts - b.ts || b.dur - a.dur), stack = [];
  let depth = 0;
  for (const e of ev) {
    while (stack.length && stack[stack.length - 1] <= e.ts) stack.pop();
    e.d = stack.length; stack.push(e.ts + e.dur); depth = Math.max(depth, e.d + 1);
  }
  depth = Math.min(depth, MAXD);
  rows.push({k, y, depth, ev}); y += depth * ROW + 12;
}
const c = document.getElementById("c"); c.width = W; c.height = y + 10;
const g = c.getContext("2d"); g.font = "11px sans-serif"; g.textBaseline = "middle";
function col(n) { let h = 0; for (const ch of n.split(" ")[0]) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  if (n.startsWith("ctxprof.") || n === "decode step" || D.ourNames.includes(n)) return `hsl(${h % 60 + 190},60%,62%)`;
  return `hsl(${h % 360},45%,75%)`; }
g.fillStyle = "#333";
for (let t = 0; t <= 10; t++) { const x = LEFT + t * (W - LEFT - 10) / 10;
  g.fillText(((t0 + t * (t1 - t0) / 10 - t0) / 1000).toFixed(1) + " ms", x + 2, 12);
  g.fillStyle = "#eee"; g.fillRect(x, 20, 1, y); g.fillStyle = "#333"; }
for (const r of rows) {
  g.fillStyle = "#000"; g.fillText(D.names[r.k] || r.k, 4, r.y + 7);
  g.fillStyle = "#ccc"; g.fillRect(0, r.y - 6, W, 1);
  for (const e of r.ev) {
    if (e.d >= MAXD) continue;
    const xa = Math.max(LEFT, LEFT + (e.ts - t0) * sx), xb = Math.min(W - 10, LEFT + (e.ts + e.dur - t0) * sx);
    if (xb <= xa) continue;
    const x = xa, w = Math.max(1, xb - xa), yy = r.y + e.d * ROW;
    g.fillStyle = col(e.name); g.fillRect(x, yy, w, ROW - 1);
    if (w > 40) { g.save(); g.beginPath(); g.rect(x, yy, w, ROW); g.clip(); g.fillStyle = "#000";
      g.fillText(e.name, x + 2, yy + 7); g.restore(); }
  }
}
document.getElementById("h").textContent = D.title;
</script></body></html>"""


def page_data(tl: dict, n_steps: int, first: int = 0) -> dict:
    ev = [e for e in tl["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    meta = [e for e in tl["traceEvents"] if e.get("ph") == "M"]
    info = (tl.get("otherData") or {}).get("ctxprof") or {}
    ours_pid = next((e["pid"] for e in ev if e["name"] == "decode step"), 1)
    steps = sorted((e for e in ev if e["name"] in ("decode step", "prefill") and e["pid"] == ours_pid),
                   key=lambda e: e["ts"])
    show = steps[first:first + n_steps] or ev
    t0 = min(e["ts"] for e in show)
    t1 = max(e["ts"] + e["dur"] for e in show)
    pad = (t1 - t0) * 0.02
    t0, t1 = t0 - pad, t1 + pad
    keep = [{"pid": e["pid"], "tid": e.get("tid", 0), "ts": e["ts"], "dur": e["dur"], "name": str(e["name"])}
            for e in ev if e["ts"] < t1 and e["ts"] + e["dur"] > t0 and e["dur"] > 0]
    names: dict[str, str] = {}
    procs = {e["pid"]: e["args"].get("name", "") for e in meta if e.get("name") == "process_name"}
    for e in meta:
        if e.get("name") == "thread_name":
            names[f"{e['pid']}/{e.get('tid', 0)}"] = f"{procs.get(e['pid'], e['pid'])} / {e['args'].get('name', '')}"[:34]
    for k in {f"{e['pid']}/{e['tid']}" for e in keep}:
        names.setdefault(k, f"{procs.get(int(k.split('/')[0]) if k.split('/')[0].isdigit() else k, k)}"[:34])
    clock = (tl.get("otherData") or {}).get("clock") or {}
    title = (f"capture {info.get('capture')} ({info.get('trigger')}), steps {info.get('step_ids')}: showing "
             f"{len(show)} step(s), {len(keep)} slices; clock offset {clock.get('offset_ns', 0) / 1e3:.1f} us "
             f"+- {clock.get('error_bound_ns', 0) / 1e3:.1f} us (aligned on {clock.get('aligned_on')})")
    our_names = sorted({e["name"] for e in keep if e["pid"] == ours_pid})
    return {"t0": t0, "t1": t1, "events": keep, "names": names, "ours": str(ours_pid), "ourNames": our_names,
            "title": title}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("timeline")
    ap.add_argument("png")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--first", type=int, default=0)
    ns = ap.parse_args()
    data = page_data(json.loads(Path(ns.timeline).read_text()), ns.steps, ns.first)
    html = Path(tempfile.mkdtemp()) / "timeline.html"
    html.write_text(PAGE.replace("__DATA__", json.dumps(data)))
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    o = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1600,2400"):
        o.add_argument(a)
    d = webdriver.Chrome(options=o, service=Service("/usr/bin/chromedriver"))
    try:
        d.get(html.as_uri())
        from selenium.webdriver.common.by import By

        d.find_element(By.TAG_NAME, "body").screenshot(ns.png)
        print(f"{ns.png}: {data['title']}; browser {d.capabilities.get('browserName')} "
              f"{d.capabilities.get('browserVersion')}")
    finally:
        d.quit()


if __name__ == "__main__":
    main()
