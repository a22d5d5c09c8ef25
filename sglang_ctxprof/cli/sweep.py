"""``sglang-ctxprof sweep``: decode throughput and the server's phase breakdown across context lengths.

::

    sglang-ctxprof sweep --url http://127.0.0.1:30000 --ctx 64 1024 3072 5120 --repeat 3 --out runs/today
    sglang-ctxprof sweep --launch --out runs/x -- --model-path M --speculative-algorithm EAGLE3 ...

For each context length and repeat, one two-point measurement (``sweep_point.two_point``) with
exact-length, distinct prompts (``prompts``); optionally ``--sustained N`` streams one long
generation per context.  Each result is written to ``--out`` as soon as it finishes (``--resume``
skips those already there, and refuses a directory measured on another model or with other
settings), then ``summary.csv``/``summary.json``, a rich table and PNG plots.  Expected failures
(unreachable URL, not SGLang, ``--ctx`` beyond the context length, a server that dies or times out,
a cut-off stream, a full disk) end with one ``error:`` line and a non-zero exit; finished results
are kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from . import sweep_results as res
from .main import REPLY_SHAPE, CliError, os_error_line, printable, unescaped, unexpected
from .prompts import CACHE_POLICY, PROMPT_MODES, PromptPlan, tokenize_corpus
from .client import ServerClient, ClientError
from .sweep_point import NO_PROFILE_NOTE, SCHEMA, check_setup, sustained, two_point

@dataclass
class SweepArgs:
    url: str = "http://127.0.0.1:30000"
    launch: bool = False
    server_args: list[str] = field(default_factory=list)
    ctx: list[int] = field(default_factory=lambda: [64, 1024, 3072, 5120])
    repeat: int = 3
    short: int = 8
    long: int = 264
    prompt: str = "corpus"
    sustained: int = 0
    window: int = 64
    out: str | None = None
    resume: bool = False
    timeout: float = 600.0
    api_key: str | None = None
    admin_key: str | None = None
    seed: int = 0
    plots: bool = True
    no_profile: bool = False
    warmup: bool = True
    launch_log: str | None = None
    draft_tokens: list[int] = field(default_factory=list)
    fixed_acceptance: float | None = None
    arms: list[str] = field(default_factory=list)
    plain_url: str | None = None

    @staticmethod
    def add_cli_args(ap: argparse.ArgumentParser) -> None:
        d = SweepArgs()
        ap.add_argument("--url", default=d.url, help="SGLang server base URL (ignored with --launch)")
        ap.add_argument("--launch", action="store_true",
                        help="start the server yourself with the arguments after `--`, stop it at the end")
        ap.add_argument("server_args", nargs="*", help="with --launch: sglang.launch_server arguments (after --)")
        ap.add_argument("--ctx", type=int, nargs="+", default=d.ctx, help="context lengths in tokens")
        ap.add_argument("--repeat", type=int, default=d.repeat, help="two-point measurements per context")
        ap.add_argument("--short", type=int, default=d.short, help="new tokens of the short request")
        ap.add_argument("--long", type=int, default=d.long, help="new tokens of the long request")
        ap.add_argument("--prompt", choices=PROMPT_MODES, default=d.prompt,
                        help="corpus: bundled public-domain text (default); random-ids: random token ids")
        ap.add_argument("--sustained", type=int, default=d.sustained, metavar="N",
                        help="also stream one generation of N tokens per context (0: off)")
        ap.add_argument("--window", type=int, default=d.window, help="sustained tok/s window, in tokens")
        ap.add_argument("--out", default=None, help="directory for result files, summary and plots")
        ap.add_argument("--resume", action="store_true", help="skip results already in --out")
        ap.add_argument("--timeout", type=float, default=d.timeout, help="seconds per request")
        ap.add_argument("--api-key", default=None, help="bearer token if the server uses --api-key")
        ap.add_argument("--admin-key", default=None,
                        help="bearer token for the reset before each point if the server uses --admin-api-key")
        ap.add_argument("--seed", type=int, default=d.seed, help="prompt selection seed")
        ap.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
        ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the unrecorded warm-up request before each context's first point")
        ap.add_argument("--no-profile", action="store_true",
                        help="with --launch: do not add --enable-ctx-profile")
        ap.add_argument("--launch-log", default=None, help="with --launch: server log file")
        ap.add_argument("--draft-tokens", type=int, nargs="+", default=[], metavar="N",
                        help="with --launch: one sweep per draft budget (a server each; results in OUT/dt-N) "
                             "and a table of tok/s by budget and context: the budget advice measured")
        ap.add_argument("--fixed-acceptance", type=float, default=None, metavar="A",
                        help="with --launch: SGLANG_SIMULATE_ACC_LEN=A (SGLang forces every verify step to "
                             "accept A tokens incl. the bonus, on average), so context cost is measured apart "
                             "from acceptance decay; the output tokens are then not the model's")
        ap.add_argument("--arms", type=lambda v: [a.strip() for a in v.split(",") if a.strip()], default=[],
                        metavar="spec,plain",
                        help="run the same prompts with and without speculation, interleaved (with --launch: "
                             "a second server without the --speculative-* flags; else --plain-url), and print "
                             "the speedup per context, the crossover and the speculation ledger")
        ap.add_argument("--plain-url", default=None, help="with --arms and without --launch: the plain server")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> "SweepArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})

    def validate(self) -> None:
        if any(c < 2 for c in self.ctx):
            raise CliError("--ctx values must be at least 2 tokens")
        if self.repeat < 1:
            raise CliError("--repeat must be at least 1")
        if not 1 <= self.short < self.long:
            raise CliError("--short must be at least 1 and smaller than --long")
        if self.sustained < 0 or self.window < 1:
            raise CliError("--sustained must be >= 0 and --window >= 1")
        if self.resume and not self.out:
            raise CliError("--resume needs --out")
        if self.launch and not self.server_args:
            raise CliError("--launch needs the server arguments after `--` (e.g. -- --model-path M)")
        if (self.draft_tokens or self.fixed_acceptance is not None) and not self.launch:
            raise CliError("--draft-tokens and --fixed-acceptance need --launch (they change how the server starts)")
        if self.draft_tokens and (not self.out or any(n < 2 for n in self.draft_tokens)):
            raise CliError("--draft-tokens needs --out and values >= 2 (draft tokens include the verified root)")
        if self.fixed_acceptance is not None and self.fixed_acceptance < 1:
            raise CliError("--fixed-acceptance is an acceptance length incl. the bonus token: >= 1")
        if self.plain_url and not self.arms:
            raise CliError("--plain-url needs --arms spec,plain")
        if self.server_args and not self.launch:
            raise CliError(f"unexpected arguments {' '.join(self.server_args)} (server arguments need --launch)")


add_cli_args = SweepArgs.add_cli_args


def run(ns: argparse.Namespace) -> int:
    return run_args(SweepArgs.from_namespace(ns))


def run_args(args: SweepArgs, after=None) -> int:
    """Run a sweep; ``after(args, client)``, if given, runs while a launched server is still up."""
    args.validate()
    if args.arms:
        from .sweep_arms import run_arms

        return run_arms(args, after=after)
    if not args.launch:
        return sweep(args, ServerClient(args.url, args.api_key, args.timeout, args.admin_key))
    if args.draft_tokens:
        from .sweep_budget import run_budgets

        return run_budgets(args, run_args)
    from .server import ServerError, ServerProcess, admin_key

    sargs = list(args.server_args)
    if not args.no_profile and "--enable-ctx-profile" not in sargs:
        sargs.append("--enable-ctx-profile")
    log = args.launch_log or (str(Path(args.out) / "server.log") if args.out else ".cache/sweep-server.log")
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    print(f"starting SGLang: {' '.join(sargs)} (log: {log})", file=sys.stderr, flush=True)
    env = {} if args.fixed_acceptance is None else {"SGLANG_SIMULATE_ACC_LEN": str(args.fixed_acceptance)}
    srv = ServerProcess(sargs, log_path=log, env=env)
    try:
        srv.start()
    except ServerError as exc:
        raise CliError(f"{str(exc).splitlines()[0]} (see {log})") from None
    try:
        print(f"server ready in {srv.startup_s:.1f}s at {srv.url}", file=sys.stderr, flush=True)
        client = ServerClient(srv.url, args.api_key, args.timeout, admin_key(args.admin_key, args.server_args))
        rc = sweep(args, client, server=srv)
        if after is not None and rc == 0:
            after(args, client)
        return rc
    finally:
        srv.stop()
        print("server stopped.", file=sys.stderr, flush=True)


def _prepare_out(args: SweepArgs, meta: dict) -> Path | None:
    return res.prepare_out(Path(args.out), args.resume, meta) if args.out else None


def sweep(args: SweepArgs, client: ServerClient, server=None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    info = client.model_info()
    stream, max_len = tokenize_corpus(client)
    need = max(max(args.ctx) + args.long, max(args.ctx) + args.sustained)
    if max_len > 0 and need > max_len:
        raise CliError(f"--ctx {max(args.ctx)} plus {need - max(args.ctx)} new tokens exceeds the server's "
                       f"context length ({max_len} tokens)")
    has_profile = client.profile() is not None
    setup = client.server_setup()
    ctxs = sorted(set(args.ctx))
    plan = PromptPlan(stream, args.prompt, args.seed)
    plan.plan(ctxs, args.repeat, ("short", "long"))
    if args.sustained:
        plan.plan(ctxs, 1, ("sustained",))
    meta = {"schema": SCHEMA, "url": client.url, "model_path": info.get("model_path"),
            "server_args": list(args.server_args) or None, "ctx": ctxs, "repeat": args.repeat,
            "short": args.short, "long": args.long, "prompt_mode": args.prompt, "seed": args.seed,
            "cache_policy": CACHE_POLICY, "sustained": args.sustained, "window": args.window,
            "has_profile": has_profile, "max_model_len": max_len, "corpus_tokens": len(stream),
            "fixed_acceptance": args.fixed_acceptance, "server_setup": setup,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out = _prepare_out(args, meta)
    err.print(f"model {printable(info.get('model_path'))}; prompts: {args.prompt} (exact length, two different prompts "
              f"per point so the prefix cache cannot skip prefill)", highlight=False, markup=False)
    if not has_profile:
        err.print(f"[yellow]{NO_PROFILE_NOTE}; measuring throughput only[/yellow]")

    jobs = [("point", c, r) for c in ctxs for r in range(args.repeat)]
    jobs += [("sustained", c, 0) for c in ctxs] if args.sustained else []
    done_points, done_sus, skipped, ran = [], [], 0, 0
    warm = {c: plan.get(c, 0, "warmup") for c in ctxs} if args.warmup else {}  # planned last: stable plan
    client.generate(plan.get(16, 0, "warmup"), 4)  # first request of a fresh server; not recorded
    bar = Console(file=unescaped(sys.stderr))  # its own text (numbers); the rest stays escaped
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=bar, redirect_stdout=False, redirect_stderr=False) as prog:
        task = prog.add_task("sweep", total=len(jobs))
        for kind, ctx, rep in jobs:
            path = out / (res.point_name(ctx, rep) if kind == "point" else res.sustained_name(ctx)) if out else None
            if path is not None and args.resume and path.exists():
                skipped += 1
                prog.advance(task)
                continue
            prog.update(task, description=f"ctx {ctx} " + (f"repeat {rep + 1}/{args.repeat}" if kind == "point"
                                                          else f"sustained {args.sustained} tok"))
            try:
                if ctx in warm:  # one unrecorded prefill per context: first-shape costs stay out of t_a
                    client.generate(warm.pop(ctx), 1)
                if kind == "point":
                    r = two_point(client, ctx, rep, plan, args.short, args.long, has_profile)
                else:
                    r = sustained(client, ctx, args.sustained, args.window, plan, has_profile)
                check_setup(client, setup)  # measured on the server the sweep started on, or not saved
            except ClientError as exc:
                raise ClientError(_failure(exc, kind, ctx, rep, ran, out, server)) from None
            except REPLY_SHAPE as exc:  # a reply whose fields are not what SGLang sends
                raise ClientError(_failure(unexpected(exc), kind, ctx, rep, ran, out, server)) from None
            if path is not None:
                try:
                    res.write_json(path, r)
                except OSError as exc:  # a full disk: the points written so far stay
                    raise CliError(_failure(os_error_line(exc), kind, ctx, rep, ran, out, None)) from None
            ran += 1
            (done_points if kind == "point" else done_sus).append(r)
            prog.advance(task)
    if skipped:
        err.print(f"--resume: {skipped} result(s) already in {out} were not re-run", highlight=False, markup=False)
    if out is not None:
        _, done_points, done_sus = res.load_run(out)
    rows = res.summarize(done_points, done_sus)
    con = res.screen_console()
    res.render_table(rows, meta, con)
    if out is not None:
        res.write_summary(out, meta, rows)
        msg = f"results: {out}/ (one JSON per point, summary.csv, summary.json, table.txt"
        if args.plots:
            from .plots import model_title, write_plots

            pngs = write_plots(rows, out, title=model_title(info.get("model_path")))
            msg += ", " + ", ".join(Path(p).name for p in pngs)
        con.print(msg + ")", highlight=False, markup=False)
    return 0


def _failure(exc: Exception | str, kind: str, ctx: int, rep: int, ran: int, out: Path | None, server) -> str:
    where = f"ctx {ctx}" + (f" repeat {rep + 1}" if kind == "point" else " sustained")
    msg = str(exc)
    if server is not None and not server.alive():
        msg = f"the launched server exited ({msg})"
    kept = (f"{ran} result(s) finished in this run are kept in {out}; rerun with --resume to continue"
            if out else "no --out given, nothing kept")
    return f"{msg} during {where}; {kept}"
