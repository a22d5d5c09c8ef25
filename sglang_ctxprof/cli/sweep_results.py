"""Sweep result files: names, loading, per-context summary, ``summary.csv``/``summary.json``, tables.

A run directory holds ``meta.json`` (how the sweep ran), one ``point-c<ctx>-r<repeat>.json`` per
two-point measurement and one ``sustained-c<ctx>.json`` per sustained run.  ``summarize`` groups them
by context length: median and spread (half the min-max range) over the repeats for decode tok/s,
t_a, t_b, acceptance and each phase's ms per step.  Used by ``sweep``, ``report`` and ``compare``;
everything here works offline from the files alone, and a file whose fields do not have the types
these readers use is refused where it is read, naming the file and the field.  The printed table
keeps the columns a reader needs first and fits 120 columns; ``table.txt`` (written with the
summary) has every column.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Iterable

from ..model.names import CACHED_TOKENS
from ..model.records import LEAF_ORDER, leaf_columns
from .main import CliError, read_json_object, write_atomic
from .sweep_point import SCHEMA

SHORT = {"draft": "draft", "verify": "verify", "verify_attn": "v.attn", "verify_moe": "v.moe", "verify_rest": "v.rest",
         "draft_extend": "d.ext", "overhead": "ovhd", "unattributed": "unattr", "step": "step", "decode": "dec",
         "decode_attn": "dec.attn", "decode_moe": "dec.moe", "decode_rest": "dec.rest"}
TABLE_PHASES = LEAF_ORDER + ("step",)  # a row shows its leaves (records.leaf_phases) and the step


def point_name(ctx: int, repeat: int) -> str:
    return f"point-c{ctx:06d}-r{repeat:02d}.json"


def sustained_name(ctx: int) -> str:
    return f"sustained-c{ctx:06d}.json"


SHARED_BATCH = 1.05  # a point's mean decode batch above this: other requests shared the server's steps
RESUME_KEYS = ("schema", "short", "long", "prompt_mode", "seed", "sustained", "window", "fixed_acceptance")


def prepare_out(out: Path, resume: bool, meta: dict) -> Path:
    """Create the run directory ``out`` and write ``meta`` there.  One that holds results already is
    refused without ``resume``; with it, its saved meta.json must name the same model and settings
    (the points it holds are kept, and the caller runs only the missing ones)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    old = out / "meta.json"
    has_results = any(out.glob("point-c*.json")) or any(out.glob("sustained-c*.json"))
    if has_results and not resume:
        raise CliError(f"{out} already holds results: pass --resume to continue it, or choose another --out")
    if resume and old.exists():
        try:
            prev = json.loads(old.read_text())
        except (OSError, ValueError, RecursionError):
            raise CliError(f"cannot --resume {out}: its meta.json is unreadable") from None
        if not isinstance(prev, dict):
            raise CliError(f"cannot --resume {out}: its meta.json is not a sweep's")
        if prev.get("model_path") is not None and prev["model_path"] != meta.get("model_path"):
            raise CliError(f"cannot --resume {out}: it was measured on model {prev['model_path']!r}, and "
                           f"{meta.get('url')} serves {meta.get('model_path')!r}; choose another --out")
        diff = [k for k in RESUME_KEYS if prev.get(k) != meta.get(k)]
        if prev.get("server_args") and meta.get("server_args") and prev["server_args"] != meta["server_args"]:
            diff.append("server_args")
        was, now = prev.get("server_setup") or {}, meta.get("server_setup") or {}
        if was and now:  # the server's own setup (/server_info): a --url sweep has no server_args
            diff += [f"server {k}" for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
        if diff:
            raise CliError(f"cannot --resume {out}: settings differ from the saved run ({', '.join(diff)})")
    write_json(old, meta)
    return out


def write_json(path: Path, obj: Any) -> None:
    """Atomic write: a sweep killed mid-write never leaves a half file that --resume would trust."""
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


def load_run(d: str | os.PathLike) -> tuple[dict, list[dict], list[dict]]:
    """(meta, two-point results, sustained results) of a run directory.  Every file is checked on
    the way in (``_check_point``, ``_check_sustained``, ``_check_meta``): one that another version
    wrote or a hand edited is a :class:`CliError` naming the file and the field, never a crash
    further on."""
    p = Path(d)
    if not p.is_dir():
        raise CliError(f"{d} is not a directory of sweep results")
    meta = {}
    if (p / "meta.json").exists():
        meta = _read(p / "meta.json", _check_meta)
    points = [_read(f, _check_point) for f in sorted(p.glob("point-c*-r*.json"))]
    sust = [_read(f, _check_sustained) for f in sorted(p.glob("sustained-c*.json"))]
    if not points and not sust:
        raise CliError(f"{d} holds no sweep results (point-*.json)")
    return _with_server_facts(meta, points + sust), points, sust


def _with_server_facts(meta: dict, results: list[dict]) -> dict:
    """``meta`` with the server's ``timing`` and ``hw`` where it has none: the sweep writes its meta
    before any point, when the profile may not know them yet; each point's breakdown carries them."""
    out = dict(meta)
    for key in ("timing", "hw"):
        if not out.get(key):  # an empty hw ({}: a CPU server's, or not read yet) says nothing either
            out[key] = next((b[key] for b in (r.get("breakdown") or {} for r in results) if b.get(key)),
                            out.get(key))
    return out


def _read(f: Path, check) -> dict:
    obj = read_json_object(f, "ctx", "a sweep result file")
    try:
        if obj.get("schema", SCHEMA) != SCHEMA:  # another format's fields may mean other things
            raise _Bad(f"schema is {json.dumps(obj['schema'])[:40]}; this version reads {SCHEMA}")
        check(obj)
    except _Bad as exc:
        raise CliError(f"{f} is not a sweep result file this version reads: {exc}") from None
    return obj


# ---- what the readers (summarize, plots, compare, diagnose, the arms report) take from a file: a
# field may be missing or null unless said otherwise; present, it must have the type they use ----
class _Bad(Exception):
    pass


def _num(obj: dict, key: str, where: str = "", integer: bool = False, required: bool = False) -> None:
    v = obj.get(key)
    if v is None and not required:
        return
    if not isinstance(v, int if integer else (int, float)) or isinstance(v, bool):
        what = "missing" if v is None else f"{json.dumps(v)[:40]}, not {'an integer' if integer else 'a number'}"
        raise _Bad(f"{where}{key} is {what}")
    if type(v) is float and not math.isfinite(v):  # a sweep writes none (hand-edited: Infinity, NaN)
        raise _Bad(f"{where}{key} is {v}, not a finite number")


def _obj(obj: dict, key: str, where: str = "", kind: type = dict, required: bool = False) -> Any:
    v = obj.get(key)
    if v is None and not required:
        return kind()
    if not isinstance(v, kind):
        what = "missing" if v is None else f"{json.dumps(v)[:40]}, not {'an object' if kind is dict else 'a list'}"
        raise _Bad(f"{where}{key} is {what}")
    return v


def _check_breakdown(obj: dict, phases_required: bool) -> None:
    b = _obj(obj, "breakdown")
    if not b:
        return
    phases = _obj(b, "phases_ms", "breakdown.", required=phases_required)
    for ph in phases:
        _num(phases, ph, "breakdown.phases_ms.", required=True)
    for key in ("accepted_per_step", "server_tok_s", "host_gap_ms"):
        _num(b, key, "breakdown.")
    _check_meta(b, "breakdown.")


def _check_point(obj: dict) -> None:
    _num(obj, "ctx", integer=True, required=True)
    _num(obj, "repeat", integer=True, required=True)
    for key in ("prompt_tokens", CACHED_TOKENS):
        _num(obj, key, integer=True)
    for key in ("decode_tok_s", "t_a", "t_b", "accept_per_step", "server_wall_tok_s"):
        _num(obj, key)
    _check_breakdown(obj, phases_required=True)
    reqs = _obj(obj, "server_requests")
    for arm in ("short", "long"):
        r = _obj(reqs, arm, "server_requests.")
        for key in ("steps", "accepted", "committed", "decode_ms"):
            _num(r, key, f"server_requests.{arm}.")


def _check_sustained(obj: dict) -> None:
    _num(obj, "ctx", integer=True, required=True)
    _num(obj, "tokens", integer=True)
    for key in ("decode_tok_s", "server_decode_tok_s", "accept_per_step"):
        _num(obj, key)
    _check_breakdown(obj, phases_required=False)
    for i, w in enumerate(_obj(obj, "windows", kind=list)):
        if not isinstance(w, dict):
            raise _Bad(f"windows[{i}] is {json.dumps(w)[:40]}, not an object")
        for key in ("ctx_start", "ctx_end", "tok_s"):
            _num(w, key, f"windows[{i}].", required=True)


def _check_meta(obj: dict, where: str = "") -> None:
    _obj(obj, "hw", where)
    if not isinstance(obj.get("timing"), (str, type(None))):
        raise _Bad(f"{where}timing is {json.dumps(obj['timing'])[:40]}, not a string")


def _stat(values: Iterable[float | None]) -> dict[str, float] | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    v.sort()
    lo, hi = v[0], v[-1]
    return {"median": statistics.median(v), "min": lo, "max": hi, "spread": (hi - lo) / 2, "n": len(v),
            "second": v[1] if len(v) > 1 else lo}


def summarize(points: list[dict], sust: list[dict] | None = None) -> list[dict[str, Any]]:
    by_ctx: dict[int, list[dict]] = {}
    for pt in points:
        by_ctx.setdefault(int(pt["ctx"]), []).append(pt)
    sus = {int(s["ctx"]): s for s in (sust or [])}
    rows = []
    for ctx in sorted(set(by_ctx) | set(sus)):
        pts = by_ctx.get(ctx, [])
        bds = [p["breakdown"] for p in pts if p.get("breakdown")]
        phases = {}
        for ph in TABLE_PHASES:
            st = _stat(b["phases_ms"].get(ph) for b in bds)
            if st:
                phases[ph] = st
        gap = _stat(b.get("host_gap_ms") for b in bds)
        if gap:
            phases["host_gap"] = gap
        s = sus.get(ctx)
        rows.append({
            "ctx": ctx,
            "repeats": len(pts),
            "prompt_tokens": sorted({p.get("prompt_tokens") for p in pts}, key=lambda x: x or 0),
            "decode_tok_s": _stat(p.get("decode_tok_s") for p in pts),
            "t_a": _stat(p.get("t_a") for p in pts),
            "t_b": _stat(p.get("t_b") for p in pts),
            "accept_per_step": _stat(p.get("accept_per_step") for p in pts),
            "server_accept_per_step": _stat(b.get("accepted_per_step") for b in bds),
            "server_tok_s": _stat(b.get("server_tok_s") for b in bds),
            CACHED_TOKENS: max((p.get(CACHED_TOKENS) or 0 for p in pts), default=0),
            "breakdown": bool(bds),
            "mean_batch_size": max((b["mean_batch_size"] for b in bds if b.get("mean_batch_size")), default=None),
            "mean_ctx": _stat(b.get("mean_ctx") for b in bds),  # the measured steps' context (server)
            "phases_ms": phases,
            "sustained": None if s is None else {
                "tokens": s.get("tokens"), "decode_tok_s": s.get("decode_tok_s"),
                "server_decode_tok_s": s.get("server_decode_tok_s"),
                "accept_per_step": s.get("accept_per_step"),
                "server_accept_per_step": (s.get("breakdown") or {}).get("accepted_per_step"),
                "step_ms": ((s.get("breakdown") or {}).get("phases_ms") or {}).get("step"),
                "windows": s.get("windows") or []},
        })
    return rows


def _med(st: dict | None) -> float | None:
    return None if st is None else st["median"]


def csv_rows(rows: list[dict]) -> tuple[list[str], list[list[Any]]]:
    header = ["ctx", "repeats", "prompt_tokens", "decode_tok_s_median", "decode_tok_s_min", "decode_tok_s_max",
              "t_a_s", "t_b_s", "accept_per_step", "server_accept_per_step", "server_tok_s", CACHED_TOKENS]
    header += [f"ms_{p}" for p in TABLE_PHASES] + ["sustained_tok_s", "sustained_accept_per_step"]
    out = []
    for r in rows:
        d = r["decode_tok_s"] or {}
        s = r["sustained"] or {}
        out.append([r["ctx"], r["repeats"], "/".join(str(x) for x in r["prompt_tokens"]),
                    d.get("median"), d.get("min"), d.get("max"), _med(r["t_a"]), _med(r["t_b"]),
                    _med(r["accept_per_step"]), _med(r["server_accept_per_step"]), _med(r["server_tok_s"]),
                    r[CACHED_TOKENS]]
                   + [_med(r["phases_ms"].get(p)) for p in TABLE_PHASES]
                   + [s.get("decode_tok_s"), s.get("accept_per_step")])
    return header, out


def write_summary(d: str | os.PathLike, meta: dict, rows: list[dict]) -> None:
    p = Path(d)
    write_json(p / "summary.json", {"meta": meta, "rows": rows})
    header, data = csv_rows(rows)
    with open(p / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for row in data:
            w.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in row])
    write_table(p, rows, meta)


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


SCREEN_COLUMNS = 120  # what sweep/report/demo print fits a normal terminal; table.txt has every column


def _table(rows: list[dict], full: bool):
    """The sweep table.  ``full``: every column (``table.txt``).  Otherwise the columns a reader needs
    first, short enough for ``SCREEN_COLUMNS``: context, two-point tok/s and its spread, acceptance,
    ms per decode step by phase and in all, and sustained tok/s; a prompt of the wrong length is
    flagged on the context."""
    from rich.table import Table

    leaves, present = leaf_columns(r["phases_ms"] for r in rows)  # a forward whole where its split is missing
    present += ("step",) * any("step" in r["phases_ms"] for r in rows)
    has_sus = any(r["sustained"] for r in rows)
    has_srv = full and any(r["server_tok_s"] for r in rows)
    if full:
        t = Table(title="decode by context length (two-point; ms per decode step from the server)")
        heads = ["ctx", "prompt_tok", "tok/s", "±", "t_a s", "t_b s", "acc/step"] + ["srv tok/s"] * has_srv
        heads += [f"{SHORT[p]} ms" for p in present]
        heads += ["sustained tok/s (client)", "sust srv tok/s", "sust acc/step"] * has_sus
    else:
        t = Table(title="decode by context length: two-point tok/s (client); ms per decode step by phase (server)")
        heads = ["ctx", "tok/s", "±", "acc/step"] + [SHORT[p] for p in present] + ["sust tok/s"] * has_sus
    for h in heads:
        t.add_column(h, justify="right")
    for r, lv in zip(rows, leaves):
        d = r["decode_tok_s"]
        pt = "/".join(str(x) for x in r["prompt_tokens"]) or "-"
        bad = " (!)" if r["prompt_tokens"] and r["prompt_tokens"] != [r["ctx"]] else ""
        tok = [_f(_med(d), "{:.1f}"), _f(d and d["spread"], "{:.1f}")]
        acc = _f(_med(r["accept_per_step"]))
        phases = [_f(_med(r["phases_ms"].get(p)) if p in lv or p == "step" else None) for p in present]
        s = r["sustained"] or {}
        if full:
            cells = [str(r["ctx"]), pt + bad, *tok, _f(_med(r["t_a"]), "{:.3f}"), _f(_med(r["t_b"]), "{:.3f}"), acc]
            cells += [_f(_med(r["server_tok_s"]), "{:.1f}")] * has_srv + phases
            if has_sus:
                cells += [_f(s.get("decode_tok_s"), "{:.1f}"), _f(s.get("server_decode_tok_s"), "{:.1f}"),
                          _f(s.get("accept_per_step"))]
        else:
            cells = [str(r["ctx"]) + bad, *tok, acc, *phases] + [_f(s.get("decode_tok_s"), "{:.1f}")] * has_sus
        t.add_row(*cells)
    return t


def screen_console():
    """A console for the tables: the terminal's, or 200 columns when piped (``render_table`` caps it)."""
    from rich.console import Console

    con = Console()
    return con if con.is_terminal else Console(width=200)


def render_table(rows: list[dict], meta: dict, console=None) -> None:
    """The end-of-sweep table (also printed by ``report``), at most ``SCREEN_COLUMNS`` wide."""
    from rich.console import Console

    console = console or Console()
    width = min(console.width, SCREEN_COLUMNS)
    console.print(_table(rows, full=False), width=width)
    notes = footnotes(rows, meta)
    if any(r["prompt_tokens"] and r["prompt_tokens"] != [r["ctx"]] for r in rows):
        notes.insert(0, "(!): the server counted a prompt length other than the context asked for")
    notes.append("every column (prompt tokens, t_a/t_b, the server's tok/s, sustained on the server clock): "
                 "table.txt beside summary.csv")
    for line in notes:
        console.print(line, highlight=False, markup=False, width=width)


def write_table(d: str | os.PathLike, rows: list[dict], meta: dict) -> None:
    """``table.txt``: the full table, every column, and its footnotes, as plain text."""
    from rich.console import Console

    with open(Path(d) / "table.txt", "w") as f:
        con = Console(file=f, width=400, color_system=None, force_terminal=False)
        con.print(_table(rows, full=True))
        for line in footnotes(rows, meta):
            con.print(line, highlight=False, markup=False)


def footnotes(rows: list[dict], meta: dict) -> list[str]:
    out = [f"prompts: {meta.get('prompt_mode', '?')}, exact token length; prefix cache: "
           f"{meta.get('cache_policy', '?')}; max cached tokens reported by the server: "
           f"{max((r[CACHED_TOKENS] for r in rows), default=0)}",
           f"two-point: short {meta.get('short', '?')} / long {meta.get('long', '?')} new tokens, greedy, "
           f"ignore_eos; tok/s = median over repeats, ± = half the min-max range; srv tok/s = the server's "
           f"committed tokens per step / mean step time over the same requests"]
    shared = [r["ctx"] for r in rows if (r.get("mean_batch_size") or 1.0) > SHARED_BATCH]
    if shared:
        most = max(r["mean_batch_size"] for r in rows if r["ctx"] in shared)
        out.append(f"other traffic: at ctx {', '.join(map(str, shared))} the server's decode steps held more than "
                   f"one request on average (up to {most:.2f}): other requests shared them, and the sweep's "
                   f"figures assume one request at a time")
    if rows and not any(r["breakdown"] for r in rows):
        out.append("no phase breakdown: the server has no /ctx_profile (start it with --enable-ctx-profile)")
    if any(r["sustained"] for r in rows):
        out.append("sustained (client) = one streamed generation per context: tokens over the client's wall "
                   "clock from the first to the last streamed token (what users see); sust srv = the same "
                   "request's committed tokens over its first-to-last decode step on the server clock")
        out.append("two-point = marginal tok/s between a short and a long non-streamed request on the client "
                   "clock (fixed per-request costs cancel); it is not a bound on sustained: they are different "
                   "requests, one streamed, and on a shared CPU one stall moves either")
    return out
