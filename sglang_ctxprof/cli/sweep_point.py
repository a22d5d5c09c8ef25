"""One sweep measurement: a two-point decode point, or a sustained streamed generation.

Two-point: the server's ``/ctx_profile`` is reset, then two greedy ``ignore_eos`` requests with
prompts of exactly ``ctx`` tokens (two *different* prompts, see ``prompts``) run one after the
other, ``short`` and ``long`` new tokens; decode tok/s = (n_long - n_short) / (t_long - t_short)
(prefill is paid by both and cancels).  Then the profile is read back and folded into the point's
per-phase ms per step and accepted tokens per step; ``server_wall_tok_s`` is the long request's
committed tokens over its decode steps' wall time on the server clock (no prefill in it; None when
the server did not keep a row for every step).  A failed read of the server's per-request record
(other than "not in its history"), a request aborted or cut short (SGLang answers an abort 200 with
the tokens so far), or a profiler that recorded none of the point's decode steps fails the point,
so ``--resume`` measures it again.

Sustained: one streamed generation of N tokens from a ``ctx``-token prompt; decode tok/s over
windows of W tokens as the context grows, plus the server's breakdown over the same run.  With the
profiler, the server's clock of that request's decode steps gives ``server_decode_tok_s`` and
``server_windows`` beside the client's figures (a loaded client or a stream that stalls then bursts
distorts those), but only when the server kept a row for every step (else ``server_tok_s_note``
says why not).  A stream that is cut off, aborted or shorter than asked is an error, not a result.

Results are plain dicts (written as JSON by the sweep); ``SCHEMA`` names their format.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from ..model.names import CACHED_TOKENS, FORWARD_SPLIT, Phase
from ..model.records import LEAF_ORDER, leaf_phases, step_end_ns
from ..views.profile import Profile

SCHEMA = "ctxprof-sweep/1"
BREAKDOWN_PHASES: tuple[str, ...] = LEAF_ORDER + (Phase.STEP.value,)  # each leaf, each whole forward, the step
NO_PROFILE_NOTE = "no breakdown: the server has no /ctx_profile (start it with --enable-ctx-profile)"


def breakdown(body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Pool a ``/ctx_profile`` body over all its decode buckets: ms per step per phase, acceptance
    (from the buckets' exact counts).  A phase's ms per step is each bucket's robust mean over the
    steps that timed it (as the live profile's: slow steps set apart as outliers are left out, so a
    first step's warm-up cannot flip a verdict; under CUDA graphs the verify split is read on sampled
    steps only), weighted by the bucket's steps less those; a bucket without the phase adds 0, except to the parts of
    a forward (``FORWARD_SPLIT``) whose split it never read: its forward is shared out as the buckets
    that read one split theirs, so the leaves still add up to the step."""
    if not body or not body.get("buckets"):
        return None
    prof = Profile.from_dict(body)
    buckets = prof.buckets
    steps = sum(b.steps for b in buckets)
    req_steps = sum(b.req_steps for b in buckets)
    if not steps or not req_steps:
        return None
    ms = {}
    for p in BREAKDOWN_PHASES:
        if any(p in b.phases for b in buckets):
            ms[p] = _pooled(buckets, p)
    for whole, parts in FORWARD_SPLIT.items():  # the split of the buckets that read it, to the whole forward
        basis = [b for b in buckets if any(q in b.phases for q in parts)]
        share = _pooled(basis, whole) if basis else 0.0
        if share > 0 and ms.get(whole):
            for q in parts:
                if q in ms:
                    ms[q] = _pooled(basis, q) * ms[whole] / share
    acc = sum(b.accepted for b in buckets) / req_steps
    com = sum(b.committed for b in buckets) / req_steps
    step_s = ms.get(Phase.STEP.value, 0.0) / 1e3
    return {
        "steps": steps,
        "outlier_steps": steps - sum(_kept(b) for b in buckets),  # set apart from every mean here
        # where its steps ran: the prompt plus what was decoded so far (about half the long request)
        "mean_ctx": sum(b.ctx_sum for b in buckets) / req_steps,
        "mean_batch_size": req_steps / steps,
        "accepted_per_step": acc,
        "committed_per_step": com,
        "phases_ms": ms,
        "server_tok_s": com / step_s if step_s > 0 else None,
        "server_accepted_tok_s": acc / step_s if step_s > 0 else None,
        "algorithms": list(prof.algorithms),
        # the scheduler's typical host time between consecutive steps (the median: a few long gaps
        # are the client's idle time between requests), part of a step's wall time
        "host_gap_ms": ((prof.host or {}).get("between_steps") or {}).get("p50_ms"),
        "timing": prof.timing,
        "hw": prof.hw,  # the server's device facts (the roofline's), as its /ctx_profile gives them
        "buckets": [{"label": b.label, "mean_ctx": b.mean_ctx, "steps": b.steps,
                     "accepted_per_step": b.accepted_per_step,
                     "step_ms": b.robust_ms(Phase.STEP.value),
                     "phases_ms": {p: b.robust_ms(p) for p in leaf_phases(b.phases)}}
                    for b in buckets],
    }


def _kept(b) -> int:
    """A bucket's steps less those set apart as outliers (its robust mean's steps)."""
    return int(b.robust["steps"]) if b.robust else b.steps


def _pooled(buckets: list, phase: str) -> float:
    """``phase``'s ms per step over ``buckets``: each one's robust mean (its timed steps less the slow
    ones set apart, as the live profile's) by its steps less those."""
    kept = sum(_kept(b) for b in buckets)
    return sum(_kept(b) * (b.robust_ms(phase) or 0.0) for b in buckets if phase in b.phases) / kept if kept else 0.0


def _req_info(meta: Mapping[str, Any], wall_s: float, max_new: int) -> dict[str, Any]:
    return {
        "rid": meta.get("id"),
        "max_new_tokens": max_new,
        "t_s": wall_s,
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        CACHED_TOKENS: meta.get(CACHED_TOKENS),
        "spec_accept_length": meta.get("spec_accept_length"),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "e2e_latency": meta.get("e2e_latency"),
    }


def _server_request(client, rid: str | None) -> dict[str, Any] | None:
    if not rid:
        return None
    r = client.profile_request(rid)
    if not r:
        return None
    return {k: r.get(k) for k in ("steps", "accepted", "committed", "decode_ms", "prefill_ms",
                                  "prompt_tokens", "decode_tok_s")}


def _all_rows(req: Mapping[str, Any] | None) -> list[dict] | None:
    """The request's step rows when the server kept one for each of its decode steps, else None (it
    keeps a bounded number of rows per request: a clock figure from part of the steps is none)."""
    rows = list((req or {}).get("step_rows") or [])
    steps = (req or {}).get("steps")
    if isinstance(steps, int) and len(rows) < steps:
        return None
    return rows


def _wall_tok_s(client, rid: str | None) -> float | None:
    """One request's decode speed on the server's wall clock: committed tokens over the time from its
    first decode step's start to its last one's end (host time between steps included); None when
    the server did not keep a row for every step."""
    req = client.profile_request(rid) if rid else None
    rows = sorted(_all_rows(req) or [], key=lambda r: r["t_start_ns"])
    if len(rows) < 2:
        return None
    span = (step_end_ns(rows[-1]["t_start_ns"], rows[-1]["step_ms"]) - rows[0]["t_start_ns"]) / 1e9
    return sum(r["committed"] for r in rows) / span if span > 0 else None


def two_point(client, ctx: int, repeat: int, prompts, short: int, long: int,
              has_profile: bool) -> dict[str, Any]:
    """Measure one (ctx, repeat) point; raises ClientError if the server fails."""
    if has_profile:
        client.profile_reset()
    meta_a, t_a = client.generate(prompts.get(ctx, repeat, "short"), short)
    meta_b, t_b = client.generate(prompts.get(ctx, repeat, "long"), long)
    _check_complete(meta_a, short, "the short request")  # an abort answers 200 with part of the tokens
    _check_complete(meta_b, long, "the long request")
    a, b = _req_info(meta_a, t_a, short), _req_info(meta_b, t_b, long)
    n_a, n_b = a["completion_tokens"] or 0, b["completion_tokens"] or 0
    tok_s = (n_b - n_a) / (t_b - t_a) if t_b > t_a and n_b > n_a else None
    out: dict[str, Any] = {
        "schema": SCHEMA, "kind": "two_point", "ctx": ctx, "repeat": repeat,
        "time": time.time(), "prompt_mode": prompts.mode,
        "prompt_tokens": b["prompt_tokens"], "short": a, "long": b,
        "t_a": t_a, "t_b": t_b, "decode_tok_s": tok_s,
        "accept_per_step": b["spec_accept_length"],
        CACHED_TOKENS: max(a[CACHED_TOKENS] or 0, b[CACHED_TOKENS] or 0),
        "breakdown": None, "note": None,
    }
    if tok_s is None:
        out["note"] = "invalid point: the long request was not slower than the short one"
    if has_profile:
        out["breakdown"] = _recorded(client)
        ra, rb = _server_request(client, a["rid"]), _server_request(client, b["rid"])
        out["server_requests"] = {"short": ra, "long": rb}
        if ra and rb and rb["decode_ms"] > ra["decode_ms"]:
            out["server_pair_tok_s"] = (rb["committed"] - ra["committed"]) / ((rb["decode_ms"] - ra["decode_ms"]) / 1e3)
        out["server_wall_tok_s"] = _wall_tok_s(client, b["rid"])
    else:
        out["note"] = out["note"] or NO_PROFILE_NOTE
    return out


def sustained(client, ctx: int, n_tokens: int, window: int, prompts, has_profile: bool) -> dict[str, Any]:
    """Stream ``n_tokens`` from a ``ctx``-token prompt; tok/s per window of ``window`` tokens."""
    if has_profile:
        client.profile_reset()
    t0 = time.perf_counter()
    marks: list[tuple[float, int]] = []
    last: dict[str, Any] = {}
    for t, meta in client.generate_stream(prompts.get(ctx, 0, "sustained"), n_tokens):
        n = int(meta.get("completion_tokens") or 0)
        if not marks or n > marks[-1][1]:
            marks.append((t, n))
        last = meta
    _check_complete(last, n_tokens, "the streamed generation")
    client_windows = _windows([(t, n) for t, n in marks], ctx, window)
    client_tok_s = None
    if len(marks) > 1 and marks[-1][0] > marks[0][0]:
        client_tok_s = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
    out: dict[str, Any] = {
        "schema": SCHEMA, "kind": "sustained", "ctx": ctx, "repeat": 0, "time": time.time(),
        "prompt_mode": prompts.mode, "tokens": n_tokens, "window": window,
        "prompt_tokens": last.get("prompt_tokens"), "completion_tokens": last.get("completion_tokens"),
        "ttft_s": marks[0][0] - t0 if marks else None, "total_s": time.perf_counter() - t0,
        "client_decode_tok_s": client_tok_s, "client_windows": client_windows,
        "decode_tok_s": client_tok_s, "windows": client_windows, "tok_s_source": "client stream",
        "accept_per_step": last.get("spec_accept_length"), "breakdown": None, "note": None,
    }
    if not has_profile:
        out["note"] = NO_PROFILE_NOTE
        return out
    out["breakdown"] = _recorded(client)
    req = client.profile_request(last["id"]) if last.get("id") else None
    rows = _all_rows(req)
    if rows is None:
        out["server_tok_s_note"] = (f"no server-clock figure: the server kept {len(req.get('step_rows') or [])} "
                                    f"of the request's {req['steps']} step rows")
    elif len(rows) > 1:
        # the server's wall clock between decode steps: immune to a client or stream that stalls and bursts
        marks_srv, n = [(rows[0]["t_start_ns"] / 1e9, 0)], 0
        for r in rows:
            n += r["committed"]
            marks_srv.append((step_end_ns(r["t_start_ns"], r["step_ms"]) / 1e9, n))
        out["server_windows"] = _windows(marks_srv, ctx + 1, window)
        span = marks_srv[-1][0] - marks_srv[0][0]
        # beside the client's figure (what users see), never instead of it
        out["server_decode_tok_s"] = n / span if span > 0 else None
        out["server_tok_s_source"] = ("server step clock (committed tokens / wall time from first to "
                                      "last decode step)")
    return out


def check_setup(client, setup: Mapping[str, Any]) -> None:
    """The server still has the setup the sweep started on (``ServerClient.server_setup``), else a
    :class:`ClientError` naming what changed (a server restarted with other flags mid-sweep): the
    point just measured is not saved, and a resume against it is refused."""
    from .client import ClientError

    now = client.server_setup() if setup else {}
    diff = [f"{k} {setup.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(setup) | set(now))
            if setup.get(k) != now.get(k)] if now else []
    if diff:
        raise ClientError(f"the server's setup changed during the sweep ({'; '.join(diff)[:300]})")


def _check_complete(meta: Mapping[str, Any], n_tokens: int, what: str) -> None:
    """A generation that did not give every token asked for (``ignore_eos``: it must) is no
    measurement: an abort (SGLang answers it 200, with the tokens so far), or a stream cut short,
    raises :class:`ClientError`."""
    from .client import ClientError

    got = meta.get("completion_tokens")
    reason = meta.get("finish_reason")
    if isinstance(reason, Mapping) and reason.get("type") == "abort":
        raise ClientError(f"the server aborted {what} after {got} of {n_tokens} tokens "
                          f"({str(reason.get('message'))[:120]})")
    if got != n_tokens:
        raise ClientError(f"{what} ended after {got} of {n_tokens} tokens (ignore_eos: all were asked for)")


def _recorded(client) -> dict[str, Any]:
    """The point's breakdown from the server's profile; a profiler that recorded no decode step of
    it (switched off at run time) raises :class:`ClientError`, so the point is measured again."""
    from .client import ClientError

    out = breakdown(client.profile())
    if out is None:
        raise ClientError("the server's profiler recorded no decode step of this point (is profiling "
                          "switched off? POST /ctx_profile/enable)")
    return out


def _windows(marks: list[tuple[float, int]], ctx0: int, window: int) -> list[dict[str, Any]]:
    """tok/s over consecutive windows of at least ``window`` tokens of (time, tokens so far) marks."""
    out: list[dict[str, Any]] = []
    if not marks:
        return out
    ws_t, ws_n = marks[0]
    for t, n in marks[1:]:
        if n - ws_n >= window or ((t, n) == marks[-1] and n - ws_n >= window / 2):
            if t > ws_t:
                out.append({"ctx_start": ctx0 + ws_n, "ctx_end": ctx0 + n, "tokens": n - ws_n,
                            "seconds": t - ws_t, "tok_s": (n - ws_n) / (t - ws_t)})
            ws_t, ws_n = t, n
    return out
