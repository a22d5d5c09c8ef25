"""Sweep building blocks without a server: prompts, breakdown pooling, summary, CSV, plots, compare math; the printed
table fits a 120-column terminal and the full table goes to ``table.txt``."""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest

from sglang_ctxprof.cli import compare as cmp
from sglang_ctxprof.cli import sweep_results as res
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.cli.prompts import PromptPlan, corpus_text
from sglang_ctxprof.cli.sweep_point import breakdown


def test_corpus_is_bundled_and_large():
    text = corpus_text()
    assert "We hold these truths to be self-evident" in text and "Four score and seven years" in text
    assert len(text.split()) > 5000


@pytest.mark.parametrize("mode", ["corpus", "random-ids"])
def test_prompts_exact_length_distinct_and_stable(mode):
    stream = list(range(10, 1010)) * 3 + list(range(5, 500))  # wraps, repeats inside
    plan = PromptPlan(stream, mode, seed=1)
    ctxs = [2, 64, 1024, 5000]  # longer than the stream: wraps around
    plan.plan(ctxs, 3, ("short", "long"))
    heads = set()
    for c in ctxs:
        for r in range(3):
            a, b = plan.get(c, r, "short"), plan.get(c, r, "long")
            assert len(a) == len(b) == c and a != b
            heads |= {tuple(a[:2]), tuple(b[:2])}
    assert len(heads) == len(ctxs) * 3 * 2  # no two prompts share their first two tokens
    again = PromptPlan(stream, mode, seed=1)
    again.plan(ctxs, 3, ("short", "long"))
    assert again.get(1024, 2, "long") == plan.get(1024, 2, "long")  # --resume rebuilds the same prompts
    assert set(plan.get(5000, 0, "short")) <= set(stream)


def test_prompt_mode_checked():
    with pytest.raises(ValueError):
        PromptPlan(list(range(100)), "bogus")


def _bucket(label, steps, bs, acc, com, phases):
    """A bucket as a server without exact counts sent it (they are rebuilt from the means)."""
    lo = int(label.split("-")[0])
    return {"label": label, "lo": lo, "hi": 2 * lo, "steps": steps, "mean_batch_size": bs, "mean_ctx": 100.0, "accepted_per_step": acc,
            "committed_per_step": com,
            "phases": {p: {"mean_ms": ms, "total_ms": ms * steps, "count": steps} for p, ms in phases.items()}}


def test_breakdown_pools_buckets_by_steps():
    body = {"algorithms": ["EAGLE"], "timing": "cpu", "buckets": [
        _bucket("64-127", 10, 1.0, 4.0, 3.5, {"draft": 2.0, "verify_attn": 1.0, "step": 3.0}),
        _bucket("128-255", 30, 1.0, 2.0, 2.0, {"draft": 4.0, "verify_attn": 3.0, "draft_extend": 1.0, "step": 8.0}),
    ]}
    b = breakdown(body)
    assert b["steps"] == 40
    assert b["phases_ms"]["draft"] == pytest.approx((20 + 120) / 40)
    assert b["phases_ms"]["draft_extend"] == pytest.approx(30 / 40)  # ms per step over all steps
    assert b["accepted_per_step"] == pytest.approx((40 + 60) / 40)
    assert b["server_tok_s"] == pytest.approx(((35 + 60) / 40) / (((30 + 240) / 40) / 1e3))
    assert breakdown(None) is None and breakdown({"buckets": []}) is None


def _point(ctx, rep, tok_s, draft, attn, acc=3.5):
    return {"ctx": ctx, "repeat": rep, "prompt_tokens": ctx, "t_a": 0.1, "t_b": 1.0, "decode_tok_s": tok_s,
            "accept_per_step": acc, "cached_tokens": 0,
            "breakdown": {"accepted_per_step": acc, "server_tok_s": tok_s * 1.02,
                          "phases_ms": {"draft": draft, "verify_attn": attn, "step": draft + attn}}}


def _run(scale_attn=1.0, draft_add=0.0, ctxs=(64, 1024, 3072), jitter=0.02):
    pts = []
    for c in ctxs:
        for r, j in enumerate((-jitter, 0.0, jitter)):
            attn = (1.0 + 2.0 * c / 1000) * scale_attn * (1 + j)
            draft = 3.0 * (1 + j) + draft_add
            pts.append(_point(c, r, 3.5 / ((draft + attn) / 1e3), draft, attn))
    return res.summarize(pts)


def test_summary_median_spread_and_csv(tmp_path):
    rows = _run()
    assert [r["ctx"] for r in rows] == [64, 1024, 3072]
    r = rows[1]
    assert r["repeats"] == 3 and r["prompt_tokens"] == [1024] and r["breakdown"]
    assert r["phases_ms"]["verify_attn"]["median"] == pytest.approx(3.048)
    assert r["phases_ms"]["verify_attn"]["spread"] == pytest.approx(3.048 * 0.02)
    res.write_summary(tmp_path, {"prompt_mode": "corpus"}, rows)
    data = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [int(d["ctx"]) for d in data] == [64, 1024, 3072]
    assert float(data[2]["ms_verify_attn"]) == pytest.approx(7.144)
    from sglang_ctxprof.cli.plots import write_plots

    paths = write_plots(rows, tmp_path, "unit")
    assert len(paths) == 4
    for p in paths:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_compare_same_run_is_not_a_regression():
    out = cmp.compare(_run(), _run())
    assert out["exit_code"] == 0 and out["verdict"] == "inherent context scaling"
    assert out["scaling"]["slopes"]["verify_attn"] == pytest.approx(2.0, rel=0.05)
    assert all(c["status"] in ("same", "(same)") for c in out["checks"])


def test_compare_phase_regression_is_caught():
    out = cmp.compare(_run(), _run(scale_attn=1.3))
    assert out["exit_code"] == 1 and out["verdict"] == "regression"
    worse = {(c["ctx"], c["quantity"]) for c in out["checks"] if c["status"] == "worse"}
    assert (3072, "verify_attn") in worse and not any(q == "draft" for _, q in worse)


def test_compare_small_change_is_noise():
    out = cmp.compare(_run(), _run(draft_add=0.05))
    assert out["exit_code"] == 0


def test_compare_longer_context_judged_by_baseline_fit():
    base = _run(ctxs=(64, 1024, 3072))
    longer = _run(ctxs=(64, 1024, 3072, 6144))
    out = cmp.compare(base, longer)
    assert out["exit_code"] == 0 and out["verdict"] == "inherent context scaling"
    assert any(c["ctx"] == 6144 and c["source"] == "A fit" for c in out["checks"])
    slow = _run(ctxs=(64, 1024, 3072, 6144), scale_attn=1.0)
    for r in slow:
        if r["ctx"] == 6144:
            r["phases_ms"]["verify_attn"] = {k: v * 1.5 if k != "n" else v
                                             for k, v in r["phases_ms"]["verify_attn"].items()}
    assert cmp.compare(base, slow)["verdict"] == "regression"


def test_fit():
    assert cmp.fit([(0, 1), (1, 3), (2, 5)]) == pytest.approx((2.0, 1.0))
    assert cmp.fit([(1, 1), (1, 2)]) is None


# ---- the printed table and table.txt ----
FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sweep"
FULL_ONLY = ("prompt_tok", "t_a s", "t_b s", "srv tok/s", "sust srv tok/s", "sust acc/step")


def _with_sustained(rows: list[dict]) -> list[dict]:
    """The demo's rows carry a sustained run per context; the recorded fixtures do not: add one."""
    rows = copy.deepcopy(rows)
    for r in rows:
        r["sustained"] = {"tokens": 256, "decode_tok_s": 123.4, "server_decode_tok_s": 125.6,
                          "accept_per_step": 3.82, "server_accept_per_step": 3.82, "step_ms": 30.1,
                          "windows": []}
        r["phases_ms"]["unattributed"] = {"median": 0.12, "min": 0.1, "max": 0.2, "spread": 0.05, "n": 3,
                                          "second": 0.12}
    return rows


def test_report_prints_lines_of_at_most_120_columns_and_writes_the_full_table(tmp_path, capsys):
    import shutil

    deep = tmp_path / ("a-checkout-folder-with-a-long-name-" * 4) / "longer"  # a path longer than 120 columns
    shutil.copytree(FIX / "longer", deep)
    assert main(["report", str(deep), "--plots-dir", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "5120" in out and "v.attn" in out
    assert f"run {deep}" in out.splitlines()  # the path alone on its line: only it may be wider
    wide = [ln for ln in out.splitlines() if len(ln) > 120 and not ln.startswith("run ")]
    assert not wide, f"{len(wide)} line(s) wider than 120 columns, e.g. {len(wide[0])}: {wide[0]!r}"
    full = (tmp_path / "table.txt").read_text()
    for h in FULL_ONLY[:4]:
        assert h in full, h
    assert "5120" in full and "v.attn ms" in full


def test_every_column_of_a_demo_like_run_fits_or_goes_to_the_file(tmp_path):
    from rich.console import Console

    meta, points, _ = res.load_run(FIX / "longer")
    rows = _with_sustained(res.summarize(points))
    con = Console(width=200, record=True, file=open(tmp_path / "screen.txt", "w"))
    res.render_table(rows, meta, con)
    screen = con.export_text()
    assert max(len(ln) for ln in screen.splitlines()) <= 120
    for h in ("ctx", "tok/s", "acc/step", "step", "draft", "v.attn", "v.moe", "d.ext",
              "unattr", "sust tok/s"):
        assert h in screen, h
    res.write_summary(tmp_path, meta, rows)
    full = (tmp_path / "table.txt").read_text()
    for h in FULL_ONLY:
        assert h in full, h
    assert "123.4" in full and "125.6" in full


def test_a_prompt_of_the_wrong_length_is_still_flagged_on_screen(tmp_path):
    from rich.console import Console

    meta, points, _ = res.load_run(FIX / "baseline")
    rows = res.summarize(points)
    rows[0]["prompt_tokens"] = [63]
    con = Console(width=200, record=True, file=open(tmp_path / "screen.txt", "w"))
    res.render_table(rows, meta, con)
    screen = con.export_text()
    assert "64 (!)" in screen and "prompt" in screen


# ---- result files that are not this version's: one line naming the file, exit 2 ----
def _bad_run(tmp_path: Path, name: str, edit) -> Path:
    """A copy of the recorded baseline with one file edited by ``edit(obj)`` (or written anew)."""
    import json
    import shutil

    d = tmp_path / "run"
    shutil.copytree(FIX / "baseline", d)
    f = d / name
    obj = json.loads(f.read_text()) if f.exists() else {"ctx": 64, "kind": "sustained", "tokens": 32}
    edit(obj)
    f.write_text(json.dumps(obj))
    return d


def _set(key, value):
    return lambda obj: obj.__setitem__(key, value)


POINT = "point-c000064-r00.json"
BAD_FILES = [
    (POINT, _set("ctx", None), "ctx"),
    (POINT, lambda o: o["breakdown"].pop("phases_ms"), "phases_ms"),
    (POINT, _set("breakdown", [1, 2]), "breakdown"),
    (POINT, _set("decode_tok_s", "12.3"), "decode_tok_s"),
    (POINT, _set("prompt_tokens", [64]), "prompt_tokens"),
    (POINT, _set("cached_tokens", "5"), "cached_tokens"),
    (POINT, lambda o: o["breakdown"]["phases_ms"].__setitem__("draft", "4.7"), "draft"),
    (POINT, _set("repeat", "0"), "repeat"),
    ("sustained-c000064.json", _set("windows", [1]), "windows"),
    ("sustained-c000064.json", _set("breakdown", {"phases_ms": {"step": []}}), "step"),
    ("meta.json", lambda o: o.update(timing="cuda_events", hw=[1]), "hw"),
    (POINT, _set("schema", "ctxprof-sweep/99"), "schema"),  # another format: never read as this one
    ("meta.json", _set("schema", "ctxprof-sweep/99"), "schema"),
]
COMMANDS = [["report", "{d}", "--no-plots"], ["compare", str(FIX / "baseline"), "{d}"],
            ["compare", "{d}", str(FIX / "baseline")], ["diagnose", "{d}"],
            ["diagnose", str(FIX / "baseline"), "--baseline", "{d}"]]


@pytest.mark.parametrize("name, edit, what", BAD_FILES, ids=[f"{n}:{w}" for n, _, w in BAD_FILES])
@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:1] + a[2:3]) for a in COMMANDS])
def test_a_malformed_result_file_is_one_line_naming_it(tmp_path, capsys, name, edit, what, argv):
    d = _bad_run(tmp_path, name, edit)
    before = (d / name).read_text()
    assert main([a.format(d=d) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(d / name) in lines[0] and what in lines[0], lines[0]
    assert (d / name).read_text() == before  # nothing rewritten


def test_a_result_file_with_fields_of_another_version_still_loads(tmp_path):
    """Fields the reader does not use, and nulls where a number may be missing, are fine."""
    d = _bad_run(tmp_path, POINT, lambda o: o.update(future_field={"x": [1]}, decode_tok_s=None, t_a=None))
    _, points, _ = res.load_run(d)
    assert res.summarize(points)[0]["repeats"] == 3


def test_a_gpu_sweep_is_diagnosed_with_its_servers_timing_and_hardware(tmp_path):
    """The sweep writes its meta before any point, when the server's profile may not know its timing
    yet; each point's breakdown carries the server's timing and hardware, and the run's reader takes
    them from there, so a saved GPU sweep gets the roofline verdict, as the live server does."""
    from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_sweep

    hw = {"device": "X", "hbm_gbps": 1000.0, "kv_bytes_per_token": 1e6, "source": "test"}
    res.write_json(tmp_path / "meta.json", {"schema": "ctxprof-sweep/1", "ctx": [1000, 4000, 16000]})
    for c in (1000, 4000, 16000):
        pt = _point(c, 0, 100.0, 1.0, 0.2 + 1.5 * c / 1e3)
        pt["breakdown"].update(timing="cuda_events", hw=hw)
        res.write_json(tmp_path / res.point_name(c, 0), pt)
    meta, points, sust = res.load_run(tmp_path)
    assert meta["timing"] == "cuda_events" and meta["hw"] == hw
    phys = diagnose(evidence_from_sweep(res.summarize(points, sust), meta))["physics"]
    assert phys["available"] and phys["ratio"] == pytest.approx(1.5, rel=0.01)
    bad = dict(points[0], breakdown={**points[0]["breakdown"], "hw": "fast"})
    res.write_json(tmp_path / res.point_name(1000, 0), bad)
    with pytest.raises(Exception, match="hw"):
        res.load_run(tmp_path)


def test_the_tables_show_a_verify_that_ran_whole(tmp_path):
    """A CUDA-graph sweep whose split was never read: the table and the CSV show the whole verify, so
    the phases shown add up to the step (as the live page and the text view)."""
    pts = [{"ctx": c, "repeat": 0, "decode_tok_s": 100.0,
            "breakdown": {"accepted_per_step": 3.0, "phases_ms": {"draft": 3.0, "verify": 8.0, "draft_extend": 1.0,
                                                                  "overhead": 0.5, "step": 12.5}}}
           for c in (1024, 4096)]
    rows = res.summarize(pts)
    res.write_summary(tmp_path, {}, rows)
    table = (tmp_path / "table.txt").read_text()
    assert "verify" in table and "8.00" in table
    data = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert float(data[0]["ms_verify"]) == 8.0


def test_other_traffic_on_the_swept_server_is_said_in_a_footnote():
    """The sweep measures one request at a time: a point whose server steps held more (another client
    on the server) is named, with how many its steps held on average."""
    pts = [_point(64, 0, 100.0, 3.0, 1.1), _point(1024, 0, 90.0, 3.0, 3.0)]
    pts[1]["breakdown"]["mean_batch_size"] = 2.5
    pts[0]["breakdown"]["mean_batch_size"] = 1.0
    notes = res.footnotes(res.summarize(pts), {})
    assert [n for n in notes if n.startswith("other traffic: at ctx 1024 ") and "(up to 2.50)" in n]
    assert not [n for n in res.footnotes(res.summarize(pts[:1]), {}) if n.startswith("other traffic")]


def test_a_sweep_point_is_placed_where_its_steps_ran():
    """The live profile places a bucket at its steps' mean context; a sweep point likewise (the prompt
    plus what was decoded so far), so the what-if and the crossover read the same x in both."""
    from sglang_ctxprof.views.diagnosis import evidence_from_sweep

    pts = [_point(64, 0, 100.0, 3.0, 1.1), _point(1024, 0, 90.0, 3.0, 3.0)]
    pts[0]["breakdown"]["mean_ctx"], pts[1]["breakdown"]["mean_ctx"] = 128.0, 1088.0
    ev = evidence_from_sweep(res.summarize(pts), {})
    assert [(p.label, p.ctx, p.ctx_sum) for p in ev.points] == [("64", 128.0, 128.0), ("1024", 1088.0, 1088.0)]
    del pts[0]["breakdown"]["mean_ctx"], pts[1]["breakdown"]["mean_ctx"]  # a point saved before: its prompt
    assert [p.ctx for p in evidence_from_sweep(res.summarize(pts), {}).points] == [64.0, 1024.0]
