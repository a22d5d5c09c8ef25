"""The speculation ledger: is speculation paying at this context, and if not, which cost eats it?

Input: per context, a speculative step's accepted tokens per step ``AL`` (bonus included) and its
phase times (``step``, ``draft``, ``verify`` with ``verify_attn`` / ``verify_moe``,
``draft_extend``, ``overhead``), and a plain decode step's times at the same context (``step``,
``decode`` with ``decode_attn`` / ``decode_moe``, ``overhead``), measured on a plain server of the
same model.  Where the plain arm has no point at a context, its times are interpolated linearly in
context between its points (extrapolated beyond them, and labelled so; flat beyond two points less
than a token apart, whose slope says nothing far from them).  Per context:

* ``speedup`` = AL x T_plain / T_step (one request's tok/s with speculation over without);
* ``saved_ms`` = (AL - 1) x T_plain: the plain steps the accepted drafts spared, per spec step;
* ``spent_ms``: draft, draft_extend, ``verify_extra`` = verify - plain decode forward, and
  ``overhead_extra`` = the spec step's overhead (unattributed time, and the host time between steps
  where a point carries ``host_gap``) - the plain step's;
  they add up to T_step - T_plain exactly, so ``net_ms`` = saved - spent = AL x T_plain - T_step,
  and ``net_per_token_ms`` = net / AL;
* ``verify_inflation`` = verify attention / plain decode attention, ``moe_inflation`` likewise.

Across contexts (:func:`ledger`): both attention slopes (ms per 1k tokens, Theil-Sen over the
points), the extra verify attention at 32k they imply, the crossover context where the speedup
falls below 1 (interpolated between measured points, or extrapolated from the fitted step times;
labelled ``measured`` or ``extrapolated``; where the fitted lines cross at or before the longest
context measured, whose measured speedup is still 1 or more, that context as the earliest), and a
verdict that names the verify attention path when it scales worse than decode attention.  Pure:
imports nothing of SGLang, torch or OTel.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..model.stats import theil_sen

SLOPE_TOL = 1.25  # verify attention slope above this x decode's (and above +0.01 ms/1k): "scales worse"
AT_CTX = 32768  # the context the verdict quotes the extra verify attention at
_OVH = ("overhead", "unattributed")
HOST_GAP = "host_gap"  # optional: the scheduler's host time between steps, part of a step's wall time


def _interp(points: Sequence[tuple[float, float]], x: float) -> tuple[Optional[float], str]:
    """Linear interpolation of (x, y) points at ``x``: (y, "measured" | "interpolated" | "extrapolated")."""
    pts = sorted(points)
    if not pts:
        return None, "none"
    for px, py in pts:
        if abs(px - x) <= 1e-9 * max(1.0, abs(x)):
            return py, "measured"
    if len(pts) == 1:
        return pts[0][1], "extrapolated"
    if x < pts[0][0]:
        (x0, y0), (x1, y1), how = pts[0], pts[1], "extrapolated"
    elif x > pts[-1][0]:
        (x0, y0), (x1, y1), how = pts[-2], pts[-1], "extrapolated"
    else:
        i = next(k for k in range(1, len(pts)) if pts[k][0] >= x)
        (x0, y0), (x1, y1), how = pts[i - 1], pts[i], "interpolated"
    if x1 == x0:  # two points at one context (x is not it): no slope to follow
        return (y0 + y1) / 2, how
    if how == "extrapolated" and x1 - x0 < 1.0:  # closer than a token: their slope says nothing far off
        return (y0 if x < x0 else y1), how
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0), how


def _plain_at(plain: Sequence[Mapping[str, Any]], ctx: float, phase: str,
              label: Optional[str] = None) -> tuple[Optional[float], str]:
    """The plain arm's ``phase`` at ``ctx``: its point of the same label (the same context bucket of a
    profile, the same context of a sweep) where it has one, else interpolated in context."""
    same = [p for p in plain if label is not None and p.get("label") == label]
    if same:
        return (float(same[0]["phases"][phase]), "measured") if phase in same[0]["phases"] else (None, "none")
    return _interp([(float(p["ctx"]), float(p["phases"][phase])) for p in plain if phase in p["phases"]], ctx)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def row(spec: Mapping[str, Any], plain: Sequence[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The ledger of one context (``spec``: ctx, al, phases) against the plain arm's points."""
    ph = spec["phases"]
    al, ctx = float(spec["al"]), float(spec["ctx"])
    lbl = spec.get("label")
    t_step = float(ph.get("step") or 0.0) + float(ph.get(HOST_GAP) or 0.0)
    t_plain, how = _plain_at(plain, ctx, "step", lbl)
    if not t_step or not t_plain:
        return None
    t_plain += _plain_at(plain, ctx, HOST_GAP, lbl)[0] or 0.0
    fwd, _ = _plain_at(plain, ctx, "decode", lbl)
    ovh_p = sum(v for v in (_plain_at(plain, ctx, o, lbl)[0] for o in _OVH + (HOST_GAP,)) if v is not None)
    if fwd is None:  # a plain profile without the forward split: all of it is the forward
        fwd, ovh_p = t_plain, 0.0
    draft, ext, verify = (float(ph.get(p, 0.0)) for p in ("draft", "draft_extend", "verify"))
    ovh_s = sum(float(ph.get(o, 0.0)) for o in _OVH + (HOST_GAP,))
    spent = {"draft": draft, "draft_extend": ext, "verify_extra": verify - fwd, "overhead_extra": ovh_s - ovh_p}
    # what the phases do not cover (a record without a split) goes to the step's own remainder
    spent["overhead_extra"] += (t_step - t_plain) - sum(spent.values())
    saved = (al - 1.0) * t_plain
    net = al * t_plain - t_step
    va, da = ph.get("verify_attn"), _plain_at(plain, ctx, "decode_attn", lbl)[0]
    vm, dm = ph.get("verify_moe"), _plain_at(plain, ctx, "decode_moe", lbl)[0]
    return {"ctx": ctx, "label": spec.get("label", str(round(ctx))), "al": al, "step_ms": t_step,
            "plain_step_ms": t_plain, "plain_from": how, "speedup": al * t_plain / t_step,
            "saved_ms": saved, "spent_ms": spent, "net_ms": net, "net_per_token_ms": net / al if al else None,
            "verify_attn_ms": va, "decode_attn_ms": da, "verify_inflation": _ratio(va, da),
            "verify_moe_ms": vm, "decode_moe_ms": dm, "moe_inflation": _ratio(vm, dm)}


def _slope(points: Sequence[tuple[float, float]]) -> Optional[dict[str, float]]:
    ts = theil_sen([(x / 1e3, y) for x, y in points]) if len(points) >= 2 else None
    return None if ts is None else {"ms_per_1k": ts["slope"], "intercept_ms": ts["intercept"]}


def _wall(point: Mapping[str, Any]) -> float:
    return float(point["phases"]["step"]) + float(point["phases"].get(HOST_GAP) or 0.0)


def crossover(rows: Sequence[Mapping[str, Any]], spec: Sequence[Mapping[str, Any]],
               plain: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Where the speedup falls below 1: between two measured contexts, or from the fitted lines.
    ``rows``: ctx, label, speedup and al per context (the ledger's rows, or measured speedups).

    Extrapolated, with every measured speedup 1 or more: none when the speculative step grows no
    faster than AL x the plain step (it keeps paying); else where the two fitted lines cross, and
    where they cross at or before the longest context measured (the fits then disagree with the
    measured speedups there), that context, as the earliest the crossover can be."""
    rs = sorted(rows, key=lambda r: r["ctx"])
    for a, b in zip(rs, rs[1:]):
        if a["speedup"] >= 1.0 > b["speedup"]:
            x = a["ctx"] + (b["ctx"] - a["ctx"]) * (a["speedup"] - 1.0) / (a["speedup"] - b["speedup"])
            return {"ctx": x, "how": "measured", "note": f"interpolated between {a['label']} and {b['label']}"}
    if rs and rs[0]["speedup"] < 1.0:
        return {"ctx": None, "how": "measured", "note": f"speculation is slower already at {rs[0]['label']}"}
    # extrapolate: T_step(L) and T_plain(L) as lines, AL as at the longest context measured
    st = _slope([(float(s["ctx"]), _wall(s)) for s in spec if s["phases"].get("step")])
    pl = _slope([(float(p["ctx"]), _wall(p)) for p in plain if p["phases"].get("step")])
    if not rs or st is None or pl is None:
        return {"ctx": None, "how": "none", "note": "too few contexts to extrapolate"}
    al = rs[-1]["al"]
    # al * (a_p + s_p x) = a_s + s_s x  ->  x = (a_s - al a_p) / (al s_p - s_s), x in thousands
    den = al * pl["ms_per_1k"] - st["ms_per_1k"]
    num = st["intercept_ms"] - al * pl["intercept_ms"]
    if den >= 0:
        return {"ctx": None, "how": "extrapolated",
                "note": "speculation keeps paying at any context on these slopes"}
    slopes = f"spec {st['ms_per_1k']:+.3f}, plain {pl['ms_per_1k']:+.3f} ms/1k"
    last = rs[-1]
    if num / den <= last["ctx"] / 1e3:  # every measured speedup is >= 1 here: the rows say not before it
        return {"ctx": float(last["ctx"]), "how": "extrapolated",
                "note": f"at {last['label']} at the earliest: the fitted step-time lines ({slopes}, AL {al:.2f}) "
                        f"cross at ~{1e3 * num / den:.0f} tokens, not past {last['label']}, the longest context "
                        f"measured, where the measured speedup is {last['speedup']:.2f}x; the spec step grows "
                        f"faster than AL x plain, so speculation stops paying there or beyond"}
    return {"ctx": 1e3 * num / den, "how": "extrapolated",
            "note": f"from the step-time slopes ({slopes}) and AL {al:.2f} at {last['label']}"}


def _inflation(rows: Sequence[Mapping[str, Any]], spec_key: str, plain_key: str, what: str) -> dict[str, Any]:
    vs = _slope([(r["ctx"], r[spec_key]) for r in rows if r.get(spec_key) is not None])
    ds = _slope([(r["ctx"], r[plain_key]) for r in rows if r.get(plain_key) is not None])
    out: dict[str, Any] = {"verify": vs, "decode": ds}
    if vs is None or ds is None:
        out["verdict"] = f"{what}: too few contexts with both arms' {what} to compare slopes"
        return out
    x, y = vs["ms_per_1k"], ds["ms_per_1k"]
    at = AT_CTX / 1e3
    extra = (vs["intercept_ms"] + x * at) - (ds["intercept_ms"] + y * at)
    out["extra_at_ms"] = {"ctx": AT_CTX, "ms": extra}
    worse = x > 0.01 and x > SLOPE_TOL * max(y, 0.0)
    out["scales_worse"] = worse
    if worse:
        out["verdict"] = (f"the verify {what} path scales worse than decode {what}: {x:+.3f} ms per 1k against "
                          f"{y:+.3f}; at {AT_CTX // 1024}k that is {extra:.1f} ms per step")
    else:
        out["verdict"] = (f"verify {what} scales like decode {what} ({x:+.3f} against {y:+.3f} ms per 1k)")
    return out


def ledger(spec: Sequence[Mapping[str, Any]], plain: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ledger of every spec context against the plain arm, with slopes, crossover and verdict."""
    if not plain:
        return {"available": False, "reason": "no plain-decode baseline: costs per draft position are assumed"}
    spec = [s for s in spec if s["phases"].get("verify") is not None or s["phases"].get("draft") is not None]
    rows = [r for r in (row(s, plain) for s in sorted(spec, key=lambda s: s["ctx"])) if r is not None]
    if not rows:
        return {"available": False, "reason": "no context with both a speculative and a plain step time"}
    attn = _inflation(rows, "verify_attn_ms", "decode_attn_ms", "attention")
    moe = _inflation(rows, "verify_moe_ms", "decode_moe_ms", "MoE")
    cross = crossover(rows, spec, plain)
    paying = [r for r in rows if r["speedup"] >= 1.0]
    parts = []
    if len(paying) == len(rows):
        parts.append(f"speculation pays at every context measured ({rows[0]['speedup']:.2f}x at "
                     f"{rows[0]['label']} -> {rows[-1]['speedup']:.2f}x at {rows[-1]['label']})")
    elif not paying:
        parts.append(f"speculation is slower than plain decode at every context measured "
                     f"({rows[0]['speedup']:.2f}x at {rows[0]['label']} -> {rows[-1]['speedup']:.2f}x at "
                     f"{rows[-1]['label']})")
    else:
        parts.append(f"speculation pays {rows[0]['speedup']:.2f}x at {rows[0]['label']} but "
                     f"{rows[-1]['speedup']:.2f}x at {rows[-1]['label']}")
    if cross.get("ctx") is not None:
        parts.append(f"crossover at ~{cross['ctx']:.0f} tokens of context ({cross['how']})")
    if attn.get("scales_worse"):
        parts.append(attn["verdict"])
    if moe.get("scales_worse"):
        parts.append(moe["verdict"])
    return {"available": True, "rows": rows, "attention": attn, "moe": moe, "crossover": cross,
            "verdict": "; ".join(parts),
            "measured": "T_plain and every phase from the plain arm at the same context"}
