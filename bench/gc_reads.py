#!/usr/bin/env python3
"""Full garbage collections that the read routes cause, counted in one process without a server.

Python (3.11) collects its oldest generation, the whole heap, when the objects promoted there since
the last full collection (``long_lived_pending``) pass a quarter of those it held then.  In SGLang's
HTTP process that heap is big (a full collection pauses every streamed chunk ~0.5 s on this CPU),
so what matters of a read is how many container objects it leaves promoted: temporaries alive across
a young collection during a build, and whatever a memo keeps.

This script stands in for that heap with ``--ballast`` long-lived lists, fills an aggregator as a
scheduler would, then per route runs ``--reads`` reads with
``--steps`` new decode steps before each: the scheduler's answer (pickled, as it crosses to the HTTP
process) made up front, then only the HTTP side timed by the garbage collector: the number of
generation-2 collections during the reads, and promoted objects per read (estimated from it).
The code measured is whatever ``sglang_ctxprof`` the environment imports (``PYTHONPATH`` picks a
revision).  Deterministic (allocation counts, not time): no machine noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout (another revision) wins
sys.path.append(str(ROOT / "bench"))

from sglang_ctxprof.model.records import RankId, StepRecord  # noqa: E402

# After sglang_ctxprof is imported (profile_build puts ROOT first on sys.path; the package imported
# above, from the PYTHONPATH revision, stays the one every submodule comes from).
from profile_build import fill  # noqa: E402,F401  - the same n decode steps as bench/profile_build


def more(agg, start: int, n: int) -> None:
    for s in range(start, start + n):
        ph = {"draft": 0.5, "verify": 1.4, "verify_attn": 0.2, "verify_moe": 0.8, "verify_rest": 0.4,
              "draft_extend": 0.3, "overhead": 0.2}
        agg.observe(StepRecord(step_id=s, kind="decode", algorithm="EAGLE", rank=RankId(), rids=("r1", "r2"),
                               ctx_lens=(100 + s % 3000, 900 + s % 5000), accepted=(3, 3), committed=(3, 3),
                               finished=(False, False), draft_tokens=4, step_ms=3.4 + (s % 7) * 0.01,
                               phases_ms=ph, t_start_ns=s * 10_000_000, timing="cpu"))


def status(agg, s: int) -> dict:
    return {"pid": 1, "submitted": s, "enabled": True, "rank": 0, "dropped": 0}


def answer(route: str, agg, s: int) -> dict:
    """The scheduler's answer for ``route`` (as ``control.handler`` makes it)."""
    if route in ("profile", "diagnosis"):
        return {"status": status(agg, s), "state": agg.snapshot(with_requests=False).to_dict()}
    if route == "requests":
        return {"status": status(agg, s), "requests": agg.requests.slowest(1000, with_steps=False)}
    rows = agg.recent_steps_json(2048)[0]
    return {"status": status(agg, s), **({"steps_rows": rows} if isinstance(rows, list) else {"steps_json": rows})}


def reply(route: str):
    from sglang_ctxprof.views import http

    if route == "profile":
        return lambda p: http._profile_reply(p, "json")
    if route == "diagnosis":
        from sglang_ctxprof.views.http_context import PlainStore

        return lambda p: http._diagnosis_reply(p, PlainStore(), None, "json")
    if route == "requests":
        return lambda p: http._requests_reply(p, 1000)
    try:
        from sglang_ctxprof.views.http_trace import trace_reply
        return lambda p: trace_reply(p, 2048)
    except ImportError:  # before the trace writer
        from sglang_ctxprof.views.http_guard import json_response
        from sglang_ctxprof.views.trace_events import steps_trace
        return lambda p: json_response(steps_trace([(0, json.loads(p[0]["steps_json"]))], 2048))


def report(route: str, full: int, n: int) -> None:
    tracked = len(gc.get_objects())
    print(f"{route:<10} full collections {full:3d} in {n} reads  ~{full * tracked / 4 / n:8.0f} objects promoted per read")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ballast", type=int, default=1_000_000, help="long-lived container objects (the big heap)")
    ap.add_argument("--fill", type=int, default=2400, help="decode steps before the first read")
    ap.add_argument("--steps", type=int, default=10, help="new decode steps before each read")
    ap.add_argument("--reads", type=int, default=60)
    ap.add_argument("--routes", default="profile,diagnosis,requests,trace")
    ap.add_argument("--side", choices=("http", "scheduler"), default="http",
                    help="count the HTTP process's build (default) or the scheduler's answer (with its steps)")
    ns = ap.parse_args(argv)
    import sglang_ctxprof

    print(f"code: {Path(sglang_ctxprof.__file__).parent}  ballast {ns.ballast}  reads {ns.reads} per route, "
          f"{ns.steps} new steps before each")
    ballast = [[] for _ in range(ns.ballast)]
    full = [0]
    gc.callbacks.append(lambda phase, info: full.__setitem__(0, full[0] + (phase == "stop" and info["generation"] == 2)))
    for route in ns.routes.split(","):
        agg = fill(ns.fill)
        s = ns.fill
        if ns.side == "scheduler":
            answer(route, agg, s)
            gc.collect()
            full[0] = 0
            for _ in range(ns.reads - 1):
                more(agg, s, ns.steps)
                s += ns.steps
                if route != "none":
                    pickle.dumps([answer(route, agg, s)])
            report(route, full[0], ns.reads - 1)
            continue
        answers = []
        for _ in range(ns.reads):
            more(agg, s, ns.steps)
            s += ns.steps
            answers.append(pickle.dumps([answer(route, agg, s)]))
        fn = reply(route)
        fn(pickle.loads(answers[0]))  # first read: memos filled
        gc.collect()
        full[0] = 0
        for blob in answers[1:]:
            fn(pickle.loads(blob))
        report(route, full[0], ns.reads - 1)
    del ballast
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
