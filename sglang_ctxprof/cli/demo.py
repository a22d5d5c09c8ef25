"""``sglang-ctxprof demo`` (``make demo``): the whole story on this machine's CPU in a few minutes.

Builds the tiny DeepSeek-V3 (MLA + MoE, the Kimi-K2 architecture) with a draft, then runs
``sglang-ctxprof sweep --launch --arms spec,plain``: two real SGLang servers on the CPU, started side by
side, the same model with speculative decoding and without (both ``--enable-ctx-profile``), two-point
decode at 64, 1024 and 3072 tokens of context (exact-length natural-text prompts) interleaved between
them; it prints the speculative arm's per-phase table, the speedup per context with the crossover,
the speculation ledger, and last the servers' own diagnosis (the plain server's profile as the
speculative one's baseline, over requests interleaved between the two).  ``--arms spec`` runs the speculative server alone, with a sustained
streamed generation per context and the PNG plots.  The servers are stopped at the end.

``--draft eagle`` (default) uses the identity EAGLE head on a pure-bigram target for realistic
acceptance (~3.7 of 4); ``--draft eagle3`` runs the Kimi-K2-style EAGLE-3 path (acceptance ~1).
"""

from __future__ import annotations

import importlib.util
import json
from typing import Iterable
import os
from pathlib import Path

from .plots import PLOT_FILES
from .server import cpu_args
from .sweep_point import SCHEMA
from .sweep import SweepArgs, run_args
from .tiny_model import TinyModelArgs, build


def add_cli_args(ap) -> None:
    ap.add_argument("--draft", choices=("eagle", "eagle3"), default="eagle")
    ap.add_argument("--ctx", type=int, nargs="+", default=[64, 1024, 3072], help="context lengths (tokens)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--long", type=int, default=264, help="new tokens of the long two-point request")
    ap.add_argument("--sustained", type=int, default=256, help="tokens of the sustained run per context (0: off)")
    ap.add_argument("--models", default=".cache/models", help="tiny-model cache directory")
    ap.add_argument("--out", default=".cache/demo-sweep",
                    help="results, summary and plots (a previous demo's are replaced; nothing else is touched)")
    ap.add_argument("--log", default=".cache/demo-server.log")
    ap.add_argument("--arms", default="spec,plain", metavar="spec,plain",
                    help="spec,plain (default): plain decode on a second server too, started alongside and "
                         "interleaved; prints the speedup per context, the crossover and the speculation "
                         "ledger (two-point only: no sustained run, no plots).  spec: the speculative server "
                         "alone, with the sustained run and the plots")


def run(ns) -> int:
    from .main import CliError

    if importlib.util.find_spec("sglang") is None:  # the demo launches a server: say so before building
        raise ModuleNotFoundError("No module named 'sglang'", name="sglang")
    if any(c < 2 or c + max(ns.long, ns.sustained) > 8192 for c in ns.ctx):
        raise CliError("--ctx values plus new tokens must fit the tiny model's 8192-token context")
    arms = [a.strip() for a in ns.arms.split(",") if a.strip()]
    if sorted(arms) not in (["spec"], ["plain", "spec"]):
        raise CliError(f"--arms takes spec,plain or spec, not {ns.arms!r}")
    if arms == ["spec"]:
        arms = []
    ha = ns.draft == "eagle"
    os.environ.setdefault("CTXPROF_QUIET", "1")
    paths = build(TinyModelArgs(arch="deepseek-v3", draft=ns.draft, high_acceptance=ha,
                                out=os.path.join(ns.models, f"deepseek-v3-{ns.draft}{'-ha' if ha else ''}")))
    alg = "EAGLE3" if ns.draft == "eagle3" else "EAGLE"
    print(f"tiny DeepSeek-V3 (MLA+MoE) + {alg} draft on CPU; sweep at ctx {' '.join(map(str, ns.ctx))}",
          flush=True)
    clear_previous(Path(ns.out), Path(ns.models))  # a previous demo sweep (one arm or both): start afresh
    args = SweepArgs(
        launch=True, server_args=cpu_args(paths["target"], algorithm=alg, draft=paths["draft"]),
        ctx=list(ns.ctx), repeat=ns.repeat, long=ns.long, sustained=0 if arms else ns.sustained, window=64,
        out=ns.out, launch_log=ns.log, arms=arms, plots=not arms)
    return run_args(args, after=_servers_ledger if arms else _server_profile)


# What a demo writes into a sweep folder (--out, or each arm's), and beside the arms' folders: a re-run
# removes these, in a folder whose meta.json says a demo wrote it, and nothing else.
SWEEP_FILES = ("meta.json", "summary.json", "summary.csv", "table.txt", *PLOT_FILES)
SWEEP_GLOBS = ("point-c*.json", "sustained-c*.json", "point-c*.json.tmp", "sustained-c*.json.tmp")
ARMS_FILES = ("arms.json", "spec-server.log", "plain-server.log")


def _demo_sweep(d: Path, models: Path) -> bool:
    """Whether ``d`` is a sweep folder a demo wrote: its meta.json a sweep's, of a model under ``models``
    (the tiny models' cache); a sweep of the user's own is left for ``--resume`` or another --out."""
    try:
        meta = json.loads((d / "meta.json").read_text())
        model = Path(str(meta["model_path"])).resolve()
    except (OSError, ValueError, TypeError, LookupError, RecursionError):
        return False
    return meta.get("schema") == SCHEMA and model.is_relative_to(models.resolve())


def _remove(d: Path, names: Iterable[str], globs: Iterable[str] = ()) -> None:
    ours = [d / n for n in names] + [f for g in globs for f in d.glob(g)]
    for f in ours + [f.with_name(f.name + ".tmp") for f in ours]:
        if f.is_file() or f.is_symlink():
            f.unlink()


def clear_previous(out: Path, models: Path) -> None:
    """Remove a previous demo's results from ``out``: each sweep folder's files (a one-arm demo's at the
    top, an arms demo's in ``spec/`` and ``plain/``, each folder emptied of them removed) and the arms'
    report and logs; whatever else the folder holds (``--out`` may name a project's own) stays."""
    if _demo_sweep(out / "spec", models):
        _remove(out, ARMS_FILES)
    for d in (out, out / "spec", out / "plain"):
        if d.is_dir() and _demo_sweep(d, models):
            _remove(d, SWEEP_FILES, SWEEP_GLOBS)
            if d != out and not any(d.iterdir()):
                d.rmdir()


OWN_VIEW_TOKENS = 64  # new tokens of each request behind the servers' own view


def _servers_ledger(args, clients) -> None:
    """Both servers' own view: both profiles emptied, then per context two requests of
    ``OWN_VIEW_TOKENS`` new tokens on each server, interleaved (spec, plain, plain, spec: both arms
    meet the same moments of a shared machine), then the diagnosis of the speculative server's profile with the plain server's as its
    plain baseline (the ledger)."""
    import random

    from ..views.diagnosis import diagnose, evidence_from_profile
    from ..views.diagnosis_text import render_text
    from ..views.profile import Profile

    if not all([client.profile_reset() for client in clients.values()]):
        return
    arms = list(clients)
    for ctx in args.ctx:
        rng = random.Random(ctx)
        prompts = [[rng.randint(10, 4000) for _ in range(ctx)] for _ in range(2)]
        for ids, order in zip(prompts, (arms, arms[::-1])):
            for arm in order:
                clients[arm].generate(ids, OWN_VIEW_TOKENS)
    bodies = {arm: client.profile() for arm, client in clients.items()}
    if not all(bodies.values()):
        return
    ev = {arm: evidence_from_profile(Profile.from_dict(b), source=f"{arm} server") for arm, b in bodies.items()}
    print("\nThe servers' own view: GET /ctx_profile of both, diagnosed with the plain one as the baseline "
          f"(two {OWN_VIEW_TOKENS}-token requests per context on each, interleaved):\n", flush=True)
    print(render_text(diagnose(ev["spec"], plain=ev["plain"])), end="", flush=True)


def _server_profile(args, client) -> None:
    """The server's own view: one profiled window over every context, with the per-phase fit."""
    import random

    from ..views.diagnosis import diagnose, evidence_from_profile
    from ..views.diagnosis_text import render_text
    from ..views.profile import Profile
    from ..views.text import render

    if not client.profile_reset():
        return
    for ctx in args.ctx:
        rng = random.Random(ctx)
        client.generate([rng.randint(10, 4000) for _ in range(ctx)], 64)
    print("\nThe server's own view, GET /ctx_profile?format=text (one 64-token request per context):\n", flush=True)
    body = client.profile()
    if body is None:
        return
    prof = Profile.from_dict(body)
    print(render(prof), end="", flush=True)
    print("\nGET /ctx_profile/diagnosis?format=text:\n", flush=True)
    print(render_text(diagnose(evidence_from_profile(prof, source="demo server"))), end="", flush=True)
