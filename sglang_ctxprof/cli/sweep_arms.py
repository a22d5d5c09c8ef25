"""``sweep --arms spec,plain``: the same prompts on the same model with and without speculation.

With ``--launch`` two servers start from the given arguments: ``spec`` as given, ``plain`` with every
``--speculative-*`` flag removed (same model, attention backend and memory settings).  Without it,
``--url`` is the speculative server and ``--plain-url`` the plain one.  The two-point measurements
interleave: for each context and repeat both arms run back to back, in alternating order, so a drift
of the machine hits both.  Each arm's results go to ``OUT/spec`` and ``OUT/plain`` (ordinary sweep
directories: ``report``, ``compare`` and ``diagnose --plain`` read them); ``--resume`` runs only the
points an interrupted run left missing, in either arm.

The closing table gives per context the spec and plain tok/s (median over repeats) measured two ways:
the long request's decode steps on the server's wall clock (no prefill in it: the measured speedup),
and the two-point figure on the client clock (prefill noise at long context makes it the noisier);
the measured speedup (median of the per-repeat spec/plain ratios, ± half their range), the speedup the
ledger predicts from the servers' mean step times and acceptance (per interleaved pair, median: the
pair shares the machine's drift), and the crossover context where the measured speedup
falls below 1 (interpolated, or extrapolated from the step-time slopes; labelled).  Then the ledger
itself (``aggregate.ledger``).  ``OUT/arms.json`` holds all of it, and per context each pair's
agreement (:func:`pair_agreement`) with ``pair_error``, the median over the pairs of
|predicted / measured - 1|.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..model.names import SPEC_PHASES
from . import sweep_results as res
from .main import REPLY_SHAPE, CliError, unexpected

if TYPE_CHECKING:
    from .sweep import SweepArgs

ARMS = ("spec", "plain")


def plain_args(sargs: list[str]) -> list[str]:
    """The server arguments without speculative decoding: every ``--speculative-*`` flag and its value."""
    out: list[str] = []
    skip = False
    for a in sargs:
        if skip:
            skip = False
            continue
        if a.startswith("--speculative-"):
            skip = "=" not in a
            continue
        out.append(a)
    return out


def validate(args: "SweepArgs") -> None:
    if sorted(args.arms) != sorted(ARMS):
        raise CliError("--arms takes spec,plain")
    if not args.out:
        raise CliError("--arms needs --out (one directory per arm)")
    if args.draft_tokens or args.sustained:
        raise CliError("--arms runs two-point measurements only (no --draft-tokens, no --sustained)")
    if args.launch:
        if not any(a.startswith("--speculative-algorithm") for a in args.server_args):
            raise CliError("--arms with --launch needs the speculative server's arguments "
                           "(--speculative-algorithm ...); the plain arm drops them")
    elif not args.plain_url:
        raise CliError("--arms without --launch needs --url (speculative server) and --plain-url (plain server)")


def run_arms(args: "SweepArgs", after: Optional[Callable[..., None]] = None) -> int:
    from .client import ServerClient
    from .server import ServerError, ServerProcess, admin_key

    validate(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.launch:
        clients = {"spec": ServerClient(args.url, args.api_key, args.timeout, args.admin_key),
                   "plain": ServerClient(args.plain_url, args.api_key, args.timeout, args.admin_key)}
        rc = sweep_arms(args, clients)
        if after is not None and rc == 0:
            after(args, clients)
        return rc
    servers: dict[str, Any] = {}
    try:
        for arm in ARMS:  # both start at once: their start-ups overlap
            sargs = list(args.server_args) if arm == "spec" else plain_args(args.server_args)
            if not args.no_profile and "--enable-ctx-profile" not in sargs:
                sargs.append("--enable-ctx-profile")
            log = str(out / f"{arm}-server.log")
            print(f"starting the {arm} server: {' '.join(sargs)} (log: {log})", file=sys.stderr, flush=True)
            servers[arm] = ServerProcess(sargs, log_path=log)
            servers[arm].spawn()
        for arm, srv in servers.items():
            try:
                srv.ready()
            except ServerError as exc:
                raise CliError(f"{arm} server: {str(exc).splitlines()[0]} (see {srv.log_path})") from None
            print(f"{arm} server ready in {srv.startup_s:.1f}s at {srv.url}", file=sys.stderr, flush=True)
        clients = {arm: ServerClient(s.url, args.api_key, args.timeout, admin_key(args.admin_key, args.server_args))
                   for arm, s in servers.items()}
        rc = sweep_arms(args, clients)
        if after is not None and rc == 0:
            after(args, clients)
        return rc
    finally:
        for srv in servers.values():
            srv.stop()
        if servers:
            print("servers stopped.", file=sys.stderr, flush=True)


def sweep_arms(args: "SweepArgs", clients: dict[str, Any]) -> int:
    from .client import ClientError
    from .prompts import PromptPlan, tokenize_corpus
    from .sweep_point import SCHEMA, check_setup, two_point

    stream, max_len = tokenize_corpus(clients["spec"])
    ctxs = sorted(set(args.ctx))
    if max_len > 0 and max(ctxs) + args.long > max_len:
        raise CliError(f"--ctx {max(ctxs)} plus {args.long} new tokens exceeds the server's context length "
                       f"({max_len} tokens)")
    plan = PromptPlan(stream, args.prompt, args.seed)
    plan.plan(ctxs, args.repeat, ("short", "long"))
    has_profile = {arm: c.profile() is not None for arm, c in clients.items()}
    setup = {arm: c.server_setup() for arm, c in clients.items()}
    if setup["plain"].get("speculative_algorithm"):  # --plain-url naming a speculative server
        raise CliError(f"the plain server {clients['plain'].url} runs speculative decoding "
                       f"({setup['plain']['speculative_algorithm']}): --plain-url must name a server without it")
    base = {"schema": SCHEMA, "ctx": ctxs, "repeat": args.repeat, "short": args.short,
            "long": args.long, "prompt_mode": args.prompt, "seed": args.seed, "sustained": 0,
            "window": args.window, "arms": list(ARMS)}
    dirs = {}
    for arm, c in clients.items():  # each arm's folder as a sweep's: refused if it holds results, unless --resume
        dirs[arm] = res.prepare_out(out_dir(args, arm), args.resume, {
            **base, "arm": arm, "url": c.url, "has_profile": has_profile[arm], "server_setup": setup[arm],
            "model_path": c.model_info().get("model_path"),
            "server_args": (list(args.server_args) if arm == "spec" else plain_args(args.server_args)) or None})
    for c in clients.values():
        c.generate(plan.get(16, 0, "warmup"), 4)  # first request of a fresh server; not recorded
    warm = {ctx: plan.get(ctx, 0, "warmup") for ctx in ctxs} if args.warmup else {}
    warmed: set[tuple[str, int]] = set()
    total, done, skipped = len(ctxs) * args.repeat, 0, 0
    for ctx in ctxs:
        for rep in range(args.repeat):
            order = ARMS if rep % 2 == 0 else ARMS[::-1]  # alternate who goes first: drift hits both
            for arm in order:
                path = dirs[arm] / res.point_name(ctx, rep)
                if args.resume and path.exists():
                    skipped += 1
                    continue
                try:
                    if ctx in warm and (arm, ctx) not in warmed:  # one unrecorded prefill per context
                        clients[arm].generate(warm[ctx], 1)
                        warmed.add((arm, ctx))
                    r = two_point(clients[arm], ctx, rep, plan, args.short, args.long, has_profile[arm])
                    check_setup(clients[arm], setup[arm])
                    ran = set((r.get("breakdown") or {}).get("phases_ms") or {})
                    spec = sorted(set(SPEC_PHASES) & ran)
                    if arm == "plain" and spec:  # --plain-url naming a speculative server: say so at once
                        raise CliError(f"the plain server {clients[arm].url} ran speculative steps ({', '.join(spec)} "
                                       f"phases): --plain-url must name a server without speculation")
                except (ClientError, *REPLY_SHAPE) as exc:
                    why = exc if isinstance(exc, ClientError) else unexpected(exc)
                    raise ClientError(f"{why} during {arm} ctx {ctx} repeat {rep + 1}; finished results are "
                                      f"kept in {args.out}; rerun with --resume to continue") from None
                res.write_json(path, r)
            done += 1
            print(f"ctx {ctx} repeat {rep + 1}/{args.repeat} ({done}/{total}) done", file=sys.stderr, flush=True)
    if skipped:
        print(f"--resume: {skipped} result(s) already in {args.out} were not re-run", file=sys.stderr, flush=True)
    for arm, d in dirs.items():  # each arm's folder is an ordinary sweep directory, summary included
        meta, points, _ = res.load_run(d)
        rows = res.summarize(points)
        res.write_summary(d, meta, rows)
        if arm == "spec":
            print(f"\nthe speculative arm ({d}):", flush=True)
            res.render_table(rows, meta, res.screen_console())
    report = arms_report(Path(args.out))
    res.write_json(Path(args.out) / "arms.json", report)
    print("\n".join(render_arms(report)), flush=True)
    return 0


def out_dir(args: "SweepArgs", arm: str) -> Path:
    return Path(args.out) / arm


def arms_report(out: Path) -> dict[str, Any]:
    """The arms table and the ledger from ``OUT/spec`` and ``OUT/plain`` (offline)."""
    from ..aggregate.ledger import crossover, ledger
    from ..views.diagnosis import evidence_from_sweep, ledger_points
    from .diagnose import plain_arm

    runs = {arm: res.load_run(out / arm) for arm in ARMS}
    rows = {arm: res.summarize(pts) for arm, (_, pts, _) in runs.items()}
    ev = {arm: evidence_from_sweep(rows[arm], runs[arm][0], source=f"sweep {out / arm}") for arm in ARMS}
    plain_arm(ev["plain"], f"the plain arm {out / 'plain'}")
    led = ledger(ledger_points(ev["spec"]), ledger_points(ev["plain"]))
    led["plain_source"] = ev["plain"].source
    at = {r["label"]: r for r in led.get("rows") or []}  # a row's label is its sweep context (its x: where
    predicted = {label: r["speedup"] for label, r in at.items()}  # its steps ran, a little later)
    table = []
    for ctx in sorted({p["ctx"] for p in runs["spec"][1]} & {p["ctx"] for p in runs["plain"][1]}):
        row: dict[str, Any] = {"ctx": ctx, "predicted_speedup": predicted.get(str(ctx))}
        for key, name in (("server_wall_tok_s", "server"), ("decode_tok_s", "client")):
            by = {arm: {p["repeat"]: p.get(key) for p in runs[arm][1] if p["ctx"] == ctx} for arm in ARMS}
            spec = {r: v for r, v in by["spec"].items() if v}
            plain = {r: v for r, v in by["plain"].items() if v}
            reps = sorted(r for r in spec if r in plain)
            ratios = [spec[r] / plain[r] for r in reps]
            row[name] = {"repeats": len(reps),
                         "spec_tok_s": statistics.median(spec[r] for r in reps) if reps else None,
                         "plain_tok_s": statistics.median(plain[r] for r in reps) if reps else None,
                         "speedup": statistics.median(ratios) if ratios else None,
                         "speedup_spread": (max(ratios) - min(ratios)) / 2 if ratios else None,
                         **mean_ci95(ratios, "speedup")}
        # the ledger's prediction per interleaved pair (both arms' steps measured side by side), median
        agree = pair_agreement(runs["spec"][1], runs["plain"][1], ctx)
        pairs = [a["point_predicted"] for a in agree]
        if pairs:
            row["predicted_speedup"] = statistics.median(pairs)
        row.update(mean_ci95(pairs, "predicted"))
        row["pairs"] = agree
        errs = [abs(a["error"]) for a in agree if a["error"] is not None]
        row["pair_error"] = statistics.median(errs) if errs else None
        table.append(row)
    by = "server" if table and all(t["server"]["speedup"] for t in table) else "client"  # one kind for all
    for t in table:  # a crossover between a server figure and a client one would mean nothing
        t["speedup"], t["speedup_by"] = t[by]["speedup"], by
    measured = [{"ctx": float(at[str(t["ctx"])]["ctx"] if str(t["ctx"]) in at else t["ctx"]), "label": str(t["ctx"]),
                 "speedup": t["speedup"], "al": at[str(t["ctx"])]["al"] if str(t["ctx"]) in at else 1.0}
                for t in table if t["speedup"] is not None]
    cross = crossover(measured, ledger_points(ev["spec"]), ledger_points(ev["plain"]))
    return {"table": table, "crossover": cross, "ledger": led}


def pair_agreement(spec: list[dict[str, Any]], plain: list[dict[str, Any]], ctx: int) -> list[dict[str, Any]]:
    """Per interleaved pair at ``ctx`` (the two arms' points of one repeat): the measured speedup (spec
    over plain tok/s of the long request's decode steps on the server's wall clock, as the table has
    it), the ledger's speedup (``aggregate.ledger.row``) from the same steps' own measurements (the
    long request's accepted tokens per step, bonus included, and mean step time, plus the point's
    typical host gap), and ``error`` = predicted / measured - 1.  Both sides come from the same steps'
    timings: an accounting check (accepted tokens, step time, host time), not a timing threshold.
    ``point_predicted`` is the ledger's speedup from the points' pooled breakdowns (both requests'
    steps, as ``predicted_speedup``); the short request's few steps make it the noisier one."""
    from ..aggregate.ledger import row as ledger_row

    out = []
    for sp in sorted((p for p in spec if p["ctx"] == ctx), key=lambda p: p["repeat"]):
        pp = next((p for p in plain if p["ctx"] == ctx and p["repeat"] == sp["repeat"]), None)
        if pp is None or not sp.get("breakdown") or not pp.get("breakdown"):
            continue
        pooled = ledger_row(_ledger_point(sp), [_ledger_point(pp)])
        if pooled is None:
            continue
        s_tok, p_tok = sp.get("server_wall_tok_s"), pp.get("server_wall_tok_s")
        measured = s_tok / p_tok if s_tok and p_tok else None
        long_s, long_p = _long_point(sp), _long_point(pp)
        own = ledger_row(long_s, [long_p]) if long_s and long_p else None
        predicted = own["speedup"] if own else None
        out.append({"repeat": sp["repeat"], "predicted": predicted, "measured": measured,
                    "error": predicted / measured - 1.0 if predicted and measured else None,
                    "point_predicted": pooled["speedup"],
                    "al": own["al"] if own else None, "step_ms": own["step_ms"] if own else None,
                    "plain_step_ms": own["plain_step_ms"] if own else None})
    return out


def _long_point(pt: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The long request's own decode steps in the shape of ``aggregate.ledger``: its accepted tokens
    per step (bonus included) and mean step time, with the point's typical host gap between steps."""
    r = (pt.get("server_requests") or {}).get("long") or {}
    if not r.get("steps") or not r.get("decode_ms") or r.get("accepted") is None:
        return None
    ph = {"step": r["decode_ms"] / r["steps"]}
    if pt["breakdown"].get("host_gap_ms") is not None:
        ph["host_gap"] = pt["breakdown"]["host_gap_ms"]
    return {"ctx": float(pt["ctx"]), "label": str(pt["ctx"]), "al": r["accepted"] / r["steps"], "phases": ph}


def mean_ci95(xs: list[float], name: str) -> dict[str, Optional[float]]:
    """``{name}_mean`` and ``{name}_ci95``: the mean of the per-repeat values and the half-width of its
    95% confidence interval (Student's t; None below two repeats)."""
    if not xs:
        return {f"{name}_mean": None, f"{name}_ci95": None}
    n = len(xs)
    ci = _T95[min(n - 1, len(_T95) - 1)] * statistics.stdev(xs) / n ** 0.5 if n >= 2 else None
    return {f"{name}_mean": statistics.fmean(xs), f"{name}_ci95": ci}


# Student's t, 97.5% quantile, by degrees of freedom (index); beyond 10 the value at 10 (conservative)
_T95 = (float("inf"), 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def _ledger_point(pt: dict[str, Any]) -> dict[str, Any]:
    """One two-point result in the shape of ``aggregate.ledger`` (a plain arm accepts one token per step)."""
    b = pt["breakdown"]
    ph = dict(b.get("phases_ms") or {})
    if b.get("host_gap_ms") is not None:
        ph["host_gap"] = b["host_gap_ms"]
    return {"ctx": float(pt["ctx"]), "label": str(pt["ctx"]), "al": float(b.get("accepted_per_step") or 1.0),
            "phases": ph}


def render_arms(rep: dict[str, Any]) -> list[str]:
    from ..views.ledger_text import render_ledger

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    head = ["ctx", "repeats", "spec tok/s", "plain tok/s", "speedup", "±", "mean ±95% CI", "ledger speedup",
            "client spec", "client plain", "client speedup", "±"]
    rows = []
    for t in rep["table"]:
        s, c = t["server"], t["client"]
        rows.append([str(t["ctx"]), str(s["repeats"]), f(s["spec_tok_s"], "{:.2f}"), f(s["plain_tok_s"], "{:.2f}"),
                     f(s["speedup"], "{:.3f}"), f(s["speedup_spread"], "{:.3f}"),
                     f(s.get("speedup_mean"), "{:.3f}") + " ±" + f(s.get("speedup_ci95"), "{:.3f}"),
                     f(t["predicted_speedup"], "{:.3f}"),
                     f(c["spec_tok_s"], "{:.2f}"), f(c["plain_tok_s"], "{:.2f}"), f(c["speedup"], "{:.3f}"),
                     f(c["speedup_spread"], "{:.3f}")])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    out = ["", "speculative vs plain decode, same prompts, interleaved: tok/s of the long request's decode steps "
               "on the server's wall clock (no prefill; host time between steps included), and the two-point "
               "tok/s on the client clock; speedup = median of the per-repeat ratios, ± half their range; their mean "
               "± the half-width of its 95% confidence interval (Student's t)",
           "  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    c = rep["crossover"]
    by = next((t["speedup_by"] for t in rep["table"] if t.get("speedup_by")), "server")
    out.append(f"crossover (measured speedup < 1, the {by} speedups): "
               + (f"~{c['ctx']:.0f} tokens of context, {c['how']} ({c['note']})"
                  if c.get("ctx") is not None else f"none ({c['note']})"))
    out += [""] + render_ledger(rep["ledger"])
    return out
