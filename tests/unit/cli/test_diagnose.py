"""``sglang-ctxprof diagnose`` at its file boundary: a saved profile whose nested fields another
version wrote or a hand edited is one ``error:`` line naming the file (exit 2), as the source, the
``--baseline`` or the ``--plain`` arm; a baseline with nothing comparable exits 2, not 0."""

from __future__ import annotations

import copy
import json
import threading

import pytest

from http_fakes import JsonHandler, QuietServer
from sglang_ctxprof.aggregate.aggregator import Aggregator
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.model.records import RankId, StepRecord
from sglang_ctxprof.views.profile import build_profile

MS = 1_000_000


def profile(ctxs=(100, 600, 1500, 3000), attn_slope=0.5, n=4) -> dict:
    """A ``/ctx_profile`` body of batch-1 EAGLE steps at several contexts."""
    agg = Aggregator()
    t, sid = 1_700_000_000 * 10**9, 0
    for ctx in ctxs:
        for k in range(n):
            sid += 1
            attn = 1.0 + attn_slope * ctx / 1e3
            ph = {"draft": 3.0, "verify": attn + 3.0, "verify_attn": attn, "verify_moe": 2.0, "verify_rest": 1.0,
                  "draft_extend": 1.0, "overhead": 0.5}
            step = 8.5 + attn
            agg.observe(StepRecord(sid, "decode", "EAGLE", RankId(), (f"r{ctx}",), (ctx + k,), (3,), (3,), (False,),
                                   4, step, ph, t_start_ns=t, timing="cpu", t_end_ns=t + int(step * MS),
                                   exec_mode="eager", attn_backend="intel_amx", draft_depth=3,
                                   exec_reason="CUDA graphs disabled"))
            t += int((step + 0.1) * MS)
    return json.loads(json.dumps(build_profile(agg.snapshot()).to_dict()))


def _set(path, value):
    def edit(body):
        o = body
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
    return edit


def _pop(path):
    def edit(body):
        o = body
        for k in path[:-1]:
            o = o[k]
        o.pop(path[-1])
    return edit


BAD = {
    "robust fit without its slope": _set(("fits", "step", "robust"), {"method": "theil-sen"}),
    "host gaps without p50": _pop(("host", "between_steps", "p50_ms")),
    "host gaps a list": _set(("host", "between_steps"), [1]),
    "acceptance without label": _set(("acceptance_by_ctx",), [{"lo": 1}]),
    "ranks of strings": _set(("ranks",), ["x"]),
    "exec mode a list": _set(("buckets", 0, "exec_mode"), [1]),
    "host gap p50 a string": _set(("host", "between_steps", "p50_ms"), "x"),
}


@pytest.mark.parametrize("role", ["source", "--baseline", "--plain"])
@pytest.mark.parametrize("name", sorted(BAD))
def test_a_profile_with_bad_nested_fields_is_one_line_naming_the_file(tmp_path, capsys, name, role):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    body = profile()
    good.write_text(json.dumps(body))
    edited = copy.deepcopy(body)
    BAD[name](edited)
    bad.write_text(json.dumps(edited))
    argv = ["diagnose", str(bad)] if role == "source" else ["diagnose", str(good), role, str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(bad) in lines[0] and "profile" in lines[0], lines[0]


def test_good_profiles_still_diagnose(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(profile()))
    b.write_text(json.dumps(profile(attn_slope=2.0)))
    assert main(["diagnose", str(a), "--baseline", str(a)]) == 0
    assert main(["diagnose", str(b), "--baseline", str(a)]) == 1
    assert "regression in verify_attn" in capsys.readouterr().out


def test_a_baseline_with_no_shared_context_is_nothing_comparable(tmp_path, capsys):
    # one context each, and not the same one: the baseline can neither be read off nor fitted
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(profile(ctxs=(100,))))
    b.write_text(json.dumps(profile(ctxs=(3000,))))
    assert main(["diagnose", str(b), "--baseline", str(a)]) == 2
    out = capsys.readouterr().out
    assert "nothing comparable" in out and "no significant change" not in out and "no phase changed" not in out
    assert main(["diagnose", str(b), "--baseline", str(a), "--json"]) == 2
    base = json.loads(capsys.readouterr().out)["baseline"]
    assert base["comparable"] is False and base["checks"] == [] and "nothing comparable" in base["verdict"]


# ---- a live server's profile written with --save: an unwritable path is one line ----
class _Profile(JsonHandler):
    body: dict = {}

    def do_GET(self):
        self._json(200, self.body)


@pytest.fixture()
def server_url():
    srv = QuietServer(("127.0.0.1", 0), type("H", (_Profile,), {"body": profile()}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_save_to_an_unwritable_path_is_one_line(server_url, tmp_path, capsys):
    target = tmp_path / "missing-dir" / "p.json"
    assert main(["diagnose", "--url", server_url, "--save", str(target)]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err and str(target) in lines[0], err
    ok = tmp_path / "p.json"
    assert main(["diagnose", "--url", server_url, "--save", str(ok)]) == 0
    assert json.loads(ok.read_text())["buckets"] and not list(tmp_path.glob("*.tmp"))
