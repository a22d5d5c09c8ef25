"""A gc.callbacks timer for every Python process that starts with this folder on ``PYTHONPATH``.

``bench/reader_stall.py --gc-probe`` puts this folder first on the server's ``PYTHONPATH``, so
SGLang's HTTP process and the children it spawns (scheduler, detokenizer) each append one line per
garbage collection of generation >= ``CTXPROF_GC_PROBE_MIN_GEN`` (default 1) to
``$CTXPROF_GC_PROBE_DIR/gc-<pid>.tsv``: generation, start and stop on ``time.monotonic()`` (one
clock for all processes of the machine), objects collected.  Nothing happens without
``CTXPROF_GC_PROBE_DIR``.

Census (a diagnosis, slow: ~1 s per full collection): while the file ``census`` exists in that
folder, each full collection also counts the objects of the oldest generation by type before and
after it, and writes to ``census-<pid>.txt`` the types that grew most from the end of the previous
full collection to the start of this one: what the process kept, between two full collections;
and the young objects found at the start of each generation-1 collection between the two (the
candidates for promotion, most of which get promoted), by kind (a dict by its first keys).  Another ``sitecustomize`` further down the path is still imported.
"""

import os

_DIR = os.environ.get("CTXPROF_GC_PROBE_DIR")


def _install(out_dir: str) -> None:
    import gc
    import time

    min_gen = int(os.environ.get("CTXPROF_GC_PROBE_MIN_GEN", "1"))
    path = os.path.join(out_dir, f"gc-{os.getpid()}.tsv")
    f = open(path, "a", buffering=1)
    started = [0.0]
    marker = os.path.join(out_dir, "census")
    after: list = [None]
    young: dict = {}

    def kind(o):
        t = type(o)
        if t is dict:
            return "dict{" + ",".join(str(k)[:20] for k in list(o)[:4]) + "}"
        if t is tuple or t is list:
            return f"{t.__name__}{len(o) if len(o) < 10 else '10+'}:" + (type(o[0]).__name__ if o else "")
        return t.__module__ + "." + t.__qualname__

    def census():
        from collections import Counter

        return Counter(type(o).__module__ + "." + type(o).__qualname__ for o in gc.get_objects(2))

    def cb(phase, info):
        gen = info.get("generation", -1)
        if gen < min_gen:
            return
        if phase == "start":
            if gen == 1 and os.path.exists(marker):
                for o in gc.get_objects(0) + gc.get_objects(1):
                    k = kind(o)
                    young[k] = young.get(k, 0) + 1
            if gen == 2 and os.path.exists(marker):
                before = census()
                if after[0] is not None:
                    grew = before.copy()
                    grew.subtract(after[0])
                    with open(os.path.join(out_dir, f"census-{os.getpid()}.txt"), "a") as c:
                        c.write(f"full collection at {time.monotonic():.3f}: gen-2 objects {sum(before.values())}, "
                                f"grew since the last one's end by {sum(grew.values())}\n")
                        for k, v in grew.most_common(25):
                            c.write(f"  {v:8d} {k}\n")
                        c.write(f" young objects at the gen-1 collections since: {sum(young.values())}\n")
                        for k, v in sorted(young.items(), key=lambda kv: -kv[1])[:40]:
                            c.write(f"  {v:8d} {k}\n")
                young.clear()
            started[0] = time.monotonic()
        else:
            f.write(f"{gen}\t{started[0]:.6f}\t{time.monotonic():.6f}\t{info.get('collected', 0)}\n")
            if gen == 2 and os.path.exists(marker):
                after[0] = census()

    gc.callbacks.append(cb)


if _DIR:
    _install(_DIR)

# Keep a sitecustomize that this one shadows.
import importlib.util as _ilu
import sys as _sys

_here = os.path.dirname(os.path.abspath(__file__))
for _p in _sys.path:
    if _p and os.path.abspath(_p) != _here and os.path.exists(os.path.join(_p, "sitecustomize.py")):
        _spec = _ilu.spec_from_file_location("_ctxprof_shadowed_sitecustomize", os.path.join(_p, "sitecustomize.py"))
        if _spec and _spec.loader:
            _spec.loader.exec_module(_ilu.module_from_spec(_spec))
        break
