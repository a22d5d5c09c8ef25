"""The sweep's failure paths and the no-plugin path against small fake HTTP servers (no SGLang).

A fake "SGLang" answers /model_info, /tokenize and /generate (timings proportional to the tokens,
spent on a fake clock that the sweep's client reads: a long request is the slower one however busy
the machine is, as on a real server) and 404 on /ctx_profile, like a server started without
--enable-ctx-profile.  Other fakes: nothing
listening, a web server that is not SGLang.  The real-server path is tests/server/test_sweep.py.
"""

from __future__ import annotations

import io
import json

import pytest

from http_fakes import FakeClock, FakeSGLang, NotSGLang, Servers, clock_module
from sglang_ctxprof.cli import client as client_mod
from sglang_ctxprof.cli import sweep_point
from sglang_ctxprof.cli.main import main
from sglang_ctxprof.cli.server import free_port


@pytest.fixture
def fake(monkeypatch):
    clock = FakeClock()
    for mod in (client_mod, sweep_point):  # the sweep's clocks read the time the fake spends
        monkeypatch.setattr(mod, "time", clock_module(clock))

    servers = Servers()
    yield lambda handler=FakeSGLang, **attrs: servers.start(handler, **{"calls": 0, "clock": clock, **attrs})
    servers.close()


INVALID = "invalid point: the long request was not slower than the short one"
SMALL = ["--repeat", "2", "--short", "2", "--long", "20", "--no-plots"]


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1, err
    return lines[0]


def test_no_plugin_measures_throughput_and_says_no_breakdown(fake, tmp_path, capsys):
    url = fake()
    out = tmp_path / "run"
    assert main(["sweep", "--url", url, "--ctx", "32", "100", "--out", str(out), "--sustained", "12",
                 "--window", "3"] + SMALL) == 0
    text = capsys.readouterr()
    assert "no breakdown" in text.err and "no phase breakdown" in text.out
    pts = [json.loads(p.read_text()) for p in sorted(out.glob("point-*.json"))]
    assert len(pts) == 4
    for p in pts:
        assert p["prompt_tokens"] == p["ctx"] and p["breakdown"] is None and "no breakdown" in p["note"]
        assert p["decode_tok_s"] > 0 and p["t_b"] > p["t_a"]
    sus = json.loads((out / "sustained-c000100.json").read_text())
    assert sus["decode_tok_s"] > 0 and sus["windows"] and sus["completion_tokens"] == 12
    assert (out / "summary.csv").read_text().startswith("ctx,")


def test_long_request_is_slower_however_busy_the_machine(fake, tmp_path):
    # a busy machine holds each short request 50 ms of real time (on a real server the long request
    # is slower by many decode steps; the fake's modeled difference is 18 ms): every point stays valid
    out = tmp_path / "run"
    assert main(["sweep", "--url", fake(stall_short_s=0.05), "--ctx", "32", "--out", str(out)] + SMALL) == 0
    for p in sorted(out.glob("point-*.json")):
        pt = json.loads(p.read_text())
        assert pt["t_b"] - pt["t_a"] == pytest.approx(0.018, abs=1e-4), pt
        assert pt["decode_tok_s"] == pytest.approx(1000.0, rel=0.01) and pt["note"] != INVALID, pt


def test_unreachable_url(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["sweep", "--url", url, "--ctx", "64", "--out", str(tmp_path / "r")] + SMALL) == 2
    assert "cannot reach" in _err_line(capsys)


def test_not_sglang(fake, capsys):
    assert main(["sweep", "--url", fake(NotSGLang), "--ctx", "64"] + SMALL) == 2
    assert "SGLang" in _err_line(capsys)


def test_ctx_beyond_context_length(fake, tmp_path, capsys):
    url = fake(max_len=1024)
    assert main(["sweep", "--url", url, "--ctx", "64", "1010", "--out", str(tmp_path / "r")] + SMALL) == 2
    assert "context length (1024 tokens)" in _err_line(capsys)
    assert not list((tmp_path / "r").glob("point-*"))


def test_server_dies_mid_sweep_keeps_results_and_resume_finishes(fake, tmp_path, capsys):
    # warm-up + (warm-up, short, long) for ctx 32 = 4 calls: the first point finishes, then the server dies
    url = fake(die_after=4)
    out = tmp_path / "run"
    args = ["sweep", "--url", url, "--ctx", "32", "64", "--out", str(out)] + SMALL
    assert main(args) == 2
    line = _err_line(capsys)
    assert "cannot reach" in line and "--resume" in line and "kept" in line
    kept = sorted(p.name for p in out.glob("point-*.json"))
    assert kept == ["point-c000032-r00.json"]
    before = (out / kept[0]).read_text()
    assert main(args) == 2 and "already holds results" in _err_line(capsys)
    url2 = fake()
    assert main(["sweep", "--url", url2, "--ctx", "32", "64", "--out", str(out), "--resume"] + SMALL) == 0
    assert "1 result(s) already" in capsys.readouterr().err
    assert len(list(out.glob("point-*.json"))) == 4
    assert (out / kept[0]).read_text() == before  # not re-run


@pytest.mark.parametrize("argv, msg", [
    (["--ctx", "0"], "--ctx"),
    (["--repeat", "0"], "--repeat"),
    (["--short", "30", "--long", "20"], "--short"),
    (["--resume"], "--resume needs --out"),
    (["--launch"], "--launch needs"),
    (["extra-arg"], "need --launch"),
])
def test_bad_arguments(argv, msg, capsys):
    assert main(["sweep", "--url", "http://127.0.0.1:9"] + argv) == 2
    assert msg in _err_line(capsys)


def test_resume_with_other_settings_is_refused(fake, tmp_path, capsys):
    url = fake()
    out = str(tmp_path / "r")
    assert main(["sweep", "--url", url, "--ctx", "32", "--out", out] + SMALL) == 0
    capsys.readouterr()
    assert main(["sweep", "--url", url, "--ctx", "32", "--out", out, "--resume", "--repeat", "2", "--short", "3",
                 "--long", "20", "--no-plots"]) == 2
    assert "settings differ" in _err_line(capsys)


def test_server_times_out_mid_sweep(fake, tmp_path, capsys):
    url = fake(hang_after=4)
    out = tmp_path / "run"
    assert main(["sweep", "--url", url, "--ctx", "32", "--out", str(out), "--timeout", "1"] + SMALL) == 2
    line = _err_line(capsys)
    assert "timed out" in line and "ctx 32 repeat 2" in line and "--resume" in line
    assert [p.name for p in out.glob("point-*.json")] == ["point-c000032-r00.json"]


def test_a_full_disk_mid_sweep_is_one_line_and_keeps_the_finished_points(fake, tmp_path, capsys, monkeypatch):
    import errno
    from pathlib import Path

    write = Path.write_text

    def full_disk(self, data, *a, **kw):  # the second point's file: half written, then the disk is full
        if "r01" in self.name:
            write(self, data[:10], *a, **kw)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write(self, data, *a, **kw)

    monkeypatch.setattr(Path, "write_text", full_disk)
    out = tmp_path / "run"
    assert main(["sweep", "--url", fake(), "--ctx", "32", "--out", str(out)] + SMALL) == 2
    line = _err_line(capsys)
    assert "No space left on device" in line and str(out / "point-c000032-r01.json") in line, line
    assert "--resume" in line and "kept" in line, line
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("point")) == ["point-c000032-r00.json"]
    assert json.loads((out / "point-c000032-r00.json").read_text())["ctx"] == 32


class _OtherModel(FakeSGLang):
    def do_GET(self):
        if self.path == "/model_info":
            return self._json(200, {"model_path": "other/model", "is_generation": True})
        return super().do_GET()


def test_resume_against_another_model_is_refused_naming_both(fake, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["sweep", "--url", fake(), "--ctx", "32", "--out", str(out)] + SMALL) == 0
    meta = (out / "meta.json").read_text()
    capsys.readouterr()
    assert main(["sweep", "--url", fake(_OtherModel), "--ctx", "32", "64", "--out", str(out), "--resume"] + SMALL) == 2
    line = _err_line(capsys)
    assert "fake/model" in line and "other/model" in line, line
    assert (out / "meta.json").read_text() == meta and not list(out.glob("point-c000064-*"))


class _CutStream(FakeSGLang):
    """A server whose streamed generation stops early: without ``[DONE]`` (a dropped connection), or
    with it after an abort (``finish_reason`` abort, fewer tokens than asked)."""

    done = False

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw or b"{}")
        if self.path != "/generate" or not body.get("stream"):
            self.rfile = io.BytesIO(raw)  # the plain fake reads it again
            return super().do_POST()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["sampling_params"]["max_new_tokens"]
        for k in range(1, n // 2):
            meta = {"id": "s1", "prompt_tokens": len(body["input_ids"]), "completion_tokens": k,
                    "spec_accept_length": 3.0}
            if self.done and k == n // 2 - 1:
                meta["finish_reason"] = {"type": "abort", "message": "scheduler aborted the request"}
            self.wfile.write(b"data: " + json.dumps({"meta_info": meta}).encode() + b"\n\n")
        if self.done:
            self.wfile.write(b"data: [DONE]\n\n")


@pytest.mark.parametrize("done, msg", [(False, "[DONE]"), (True, "abort")])
def test_a_cut_off_sustained_stream_is_an_error_not_a_result(fake, tmp_path, capsys, done, msg):
    out = tmp_path / "run"
    url = fake(_CutStream, done=done)
    assert main(["sweep", "--url", url, "--ctx", "32", "--out", str(out), "--sustained", "12",
                 "--window", "3"] + SMALL) == 2
    line = _err_line(capsys)
    assert msg in line and "sustained" in line and "--resume" in line, line
    assert not list(out.glob("sustained-*")) and len(list(out.glob("point-*"))) == 2


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_on_a_terminal_redraws_in_place(fake, tmp_path, monkeypatch):
    """The progress bar redraws itself with a carriage return and line erases, its own text only
    (numbers the sweep formats): they reach the terminal as they are, not escaped into one long line
    (the stream escapes what servers say; the bar says nothing of theirs)."""
    monkeypatch.setenv("TERM", "xterm-256color")
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    url = fake()
    assert main(["sweep", "--url", url, "--ctx", "32", "--out", str(tmp_path / "run")] + SMALL) == 0
    err = term.getvalue()
    assert "\\x1b" not in err and "\\r" not in err, err[:400]
    assert "\r" in err or "\x1b[" in err  # redrawn in place


def test_an_interrupted_arms_sweep_resumes(fake, tmp_path, capsys):
    """``--arms``: the plain server dies mid-sweep; the finished points of both arms are kept, a rerun
    without --resume says to pass it, and --resume runs only the missing points of each arm."""
    out = tmp_path / "arms"
    # plain: warm-up, then per point (warm-up at the first repeat,) short, long: dies in ctx 32 repeat 2
    spec, plain = fake(), fake(die_after=4)
    args = ["sweep", "--arms", "spec,plain", "--url", spec, "--plain-url", plain, "--ctx", "32", "64",
            "--out", str(out)] + SMALL
    assert main(args) == 2
    line = _err_line(capsys)
    assert "cannot reach" in line and "--resume" in line, line
    kept = {arm: sorted(p.name for p in (out / arm).glob("point-*.json")) for arm in ("spec", "plain")}
    assert kept["plain"] == ["point-c000032-r00.json"] and len(kept["spec"]) >= 1, kept
    before = {arm: {n: (out / arm / n).read_text() for n in names} for arm, names in kept.items()}
    spec, plain = fake(), fake()
    args = ["sweep", "--arms", "spec,plain", "--url", spec, "--plain-url", plain, "--ctx", "32", "64",
            "--out", str(out)] + SMALL
    assert main(args) == 2 and "--resume" in _err_line(capsys)
    assert main(args + ["--resume"]) == 0, capsys.readouterr().err
    for arm in ("spec", "plain"):
        assert len(list((out / arm).glob("point-*.json"))) == 4
        assert all((out / arm / n).read_text() == t for n, t in before[arm].items())  # not re-run
    assert (out / "arms.json").exists()


def test_a_model_path_with_brackets_is_text(fake, tmp_path, capsys):
    """What the server names its model is shown as it is: rich markup in it neither fails the sweep
    nor styles the line; an output folder with brackets too."""
    url = fake(model_path="evil[/bold] [bold red]model[/]")
    out = tmp_path / "ob[/x]"
    assert main(["sweep", "--url", url, "--ctx", "32", "--out", str(out)] + SMALL) == 0
    text = capsys.readouterr()
    assert "evil[/bold] [bold red]model[/]" in text.err and "Traceback" not in text.err, text.err
    assert "ob[/x]" in text.out


def test_a_reply_of_the_wrong_shape_mid_sweep_is_one_line_and_keeps_the_finished_points(fake, tmp_path, capsys):
    url = fake(bad_meta_after=4)  # the first point finishes, then meta_info comes as a list
    out = tmp_path / "run"
    assert main(["sweep", "--url", url, "--ctx", "32", "64", "--out", str(out)] + SMALL) == 2
    line = _err_line(capsys)
    assert "unexpected" in line and "--resume" in line and "kept" in line, line
    assert sorted(p.name for p in out.glob("point-*.json")) == ["point-c000032-r00.json"]


def test_a_reply_nested_past_the_parser_is_one_line(fake, tmp_path, capsys, monkeypatch):
    from sglang_ctxprof.cli import client

    monkeypatch.setattr(client.json, "loads", lambda raw: (_ for _ in ()).throw(RecursionError("deep")))
    assert main(["sweep", "--url", fake(), "--ctx", "32"] + SMALL) == 2
    assert "JSON" in _err_line(capsys)


def test_a_reply_of_the_wrong_shape_before_the_first_point_is_one_line(fake, tmp_path, capsys, monkeypatch):
    """/tokenize answering a number for its tokens: one line naming the error (the environment switch
    shows the traceback, for a bug of ours)."""
    from sglang_ctxprof.model.names import ENV_CLI_DEBUG

    url = fake(tokens_answer=5)
    argv = ["sweep", "--url", url, "--ctx", "32"] + SMALL
    assert main(argv) == 2
    line = _err_line(capsys)
    assert "TypeError" in line and ENV_CLI_DEBUG in line, line
    monkeypatch.setenv(ENV_CLI_DEBUG, "1")
    with pytest.raises(TypeError):
        main(argv)


SETUP = {"version": "0.5.23", "speculative_algorithm": "EAGLE", "dtype": "bfloat16", "tp_size": 1}


def test_a_server_whose_setup_changes_mid_sweep_stops_it_and_the_point_is_not_saved(fake, tmp_path, capsys):
    """A server restarted with other flags between two points: the point measured after the change is
    not saved (its numbers would read as a context effect); the earlier ones are kept."""
    out = tmp_path / "run"
    url = fake(info=SETUP, info_after=5, info_then={"speculative_algorithm": "NGRAM"})
    assert main(["sweep", "--url", url, "--ctx", "32", "64", "--out", str(out)] + SMALL) == 2
    line = _err_line(capsys)
    assert "setup changed during the sweep (speculative_algorithm 'EAGLE' -> 'NGRAM')" in line and "--resume" in line
    assert sorted(p.name for p in out.glob("point-*.json")) == ["point-c000032-r00.json"]
    assert json.loads((out / "meta.json").read_text())["server_setup"] == SETUP


def test_resume_against_a_server_of_another_setup_is_refused_naming_what_differs(fake, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["sweep", "--url", fake(info=SETUP), "--ctx", "32", "--out", str(out)] + SMALL) == 0
    meta = (out / "meta.json").read_text()
    capsys.readouterr()
    other = fake(info={**SETUP, "dtype": "float16", "speculative_algorithm": None})
    assert main(["sweep", "--url", other, "--ctx", "32", "64", "--out", str(out), "--resume"] + SMALL) == 2
    line = _err_line(capsys)
    assert "settings differ from the saved run (server dtype, server speculative_algorithm)" in line, line
    assert (out / "meta.json").read_text() == meta  # the saved run's meta is kept
    assert main(["sweep", "--url", fake(), "--ctx", "32", "64", "--out", str(out), "--resume"] + SMALL) == 0


def test_a_plain_url_naming_a_speculative_server_is_refused_before_any_point(fake, tmp_path, capsys):
    """``--plain-url`` naming a server that runs speculation, with no profiler to show its phases: its
    own setup says so, before a point is measured (a spec-vs-spec table would read 1.00x, measured)."""
    out = tmp_path / "arms"
    spec, plain = fake(info=SETUP), fake(info=SETUP)
    assert main(["sweep", "--arms", "spec,plain", "--url", spec, "--plain-url", plain, "--ctx", "32",
                 "--out", str(out)] + SMALL) == 2
    line = _err_line(capsys)
    assert "runs speculative decoding (EAGLE)" in line and "--plain-url" in line, line
    assert not list(out.rglob("point-*.json"))
