"""CLI bad input: every bad argument gets one ``error:`` line and a usage hint, exit code 2,
and never a traceback - through the installed ``sglang-ctxprof`` script and ``python -m``.

Each case runs in a subprocess with a timeout, so a missing validation that would go on to build a
model or start a server fails the test instead of hanging it.  Nothing here needs a server: the
"unreachable" cases use a closed local port; the hostile-server cases a local HTTP server whose
answers carry terminal control sequences.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from http_fakes import JsonHandler, Servers
from sglang_ctxprof.cli.main import SUBCOMMANDS, main

SCRIPT = Path(sys.executable).with_name("sglang-ctxprof")


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens once the socket is closed


def run(args: list[str], module: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sglang_ctxprof.cli.main", *args] if module else [str(SCRIPT), *args]
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def assert_clean_error(p: subprocess.CompletedProcess, expect: str | None = None) -> str:
    both = p.stdout + p.stderr
    assert "Traceback" not in both, both
    assert p.returncode == 2, (p.returncode, both)
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, p.stderr
    assert "usage:" in p.stderr or "--help" in p.stderr, p.stderr
    if expect:
        assert expect.lower() in errors[0].lower(), errors[0]
    return errors[0]


URL = closed_port_url()

CASES = [
    (["frobnicate"], "invalid choice"),
    (["show", "--url"], "expected one argument"),
    (["show", "--url", "not-a-url"], "url"),
    (["show", "--url", URL], "cannot reach"),
    (["show", "--url", URL, "--json"], "cannot reach"),
    (["show", "--bogus-flag"], "unrecognized"),
    (["show", "extra-positional"], "unrecognized"),
    (["show", "--url", "http://[::1"], None),
    (["demo", "--ctx", "abc"], "invalid int"),
    (["demo", "--ctx", "0"], None),
    (["demo", "--ctx", "-5"], None),
    (["demo", "--ctx", "100000000"], None),
    (["demo", "--draft", "medusa"], "invalid choice"),
    (["demo", "--arms", "plain"], "--arms takes spec,plain or spec"),
    (["tiny-model"], "required"),
    (["tiny-model", "--out", "/tmp/ctxprof-never-written", "--arch", "gpt9"], "invalid choice"),
    (["tiny-model", "--out", "/tmp/ctxprof-never-written", "--draft", "eagle3", "--high-acceptance"],
     "high-acceptance"),
]


@pytest.mark.parametrize("args,expect", CASES, ids=[" ".join(a)[:50] for a, _ in CASES])
def test_bad_argument_is_one_clean_line(args, expect):
    assert_clean_error(run(args), expect)


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_unknown_flag_on_every_subcommand(command):
    assert_clean_error(run([command, "--definitely-not-a-flag"]))  # or "required: ..." first


def test_python_dash_m_gives_the_same_clean_error():
    """Regression: under ``python -m`` the CliError class lived twice and escaped as a traceback."""
    line = assert_clean_error(run(["show", "--url", URL], module=True), "cannot reach")
    assert line.startswith("sglang-ctxprof show: error:")


def test_no_command_prints_usage_and_fails():
    p = run([])
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr
    assert "usage:" in (p.stdout + p.stderr)


# ------------------------------------------------------------------ other people's strings, escaped
HOSTILE = "\x1b]0;owned\x07\x1b[2J\rrid\u202e\x1b[8mhidden\x1b[0m"  # a title, a clear, bidi, concealed text


class _Hostile(JsonHandler):
    """A server whose answers carry terminal control sequences: in an error, and as a capture id."""

    def do_GET(self):
        self._json(404, {"error": f"request {HOSTILE} not found"})

    def do_POST(self):
        self._json(200, {"accepted": True, "captures": [{"id": f"../../{HOSTILE}"}]})


@pytest.fixture()
def hostile_url():
    servers = Servers()
    yield servers.start(_Hostile)
    servers.close()


def test_a_server_supplied_error_reaches_the_terminal_escaped(hostile_url, capsys):
    assert main(["trace", "--url", hostile_url, "r1"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err and "\u202e" not in err and "\x07" not in err, repr(err)
    assert "\\x1b]0;owned\\x07" in err and err.endswith("--help\n"), repr(err)


def test_a_capture_id_that_is_not_one_is_refused_before_any_file(hostile_url, capsys, tmp_path):
    assert main(["capture", "--url", hostile_url, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "not a capture id" in err and "\x1b" not in err, repr(err)
    assert not (tmp_path / "out").exists() and not list(tmp_path.parent.glob("*.trace.json.gz"))


def _profile(label: str, algorithm: str) -> dict:
    """A real profile's JSON (one step of one request), its first bucket's label and its algorithm
    name as a hostile server would write them."""
    import json

    from record_fakes import trace_rec
    from sglang_ctxprof.aggregate.aggregator import Aggregator
    from sglang_ctxprof.views.profile import build_profile

    agg = Aggregator()
    agg.observe(trace_rec(0, 0, [0.5, 1, 2, 0.25, 0.75, 0.3], ctx=(100,)))
    body = json.loads(json.dumps(build_profile(agg.snapshot()).to_dict()))
    body["buckets"][0]["label"], body["algorithms"] = label, [algorithm]
    return body


class _Labels(JsonHandler):
    """A server whose profile's bucket label hides what follows it (concealed text) and whose
    algorithm name forges a line (a carriage return)."""

    def do_GET(self):
        self._json(200, _profile("64-127\x1b[8mHIDDEN", "EAGLE\rFORGED"))


def test_a_servers_label_cannot_colour_or_hide_the_plain_commands_output(capsys):
    """Colour sequences pass only for the commands that print rich tables: in ``show``'s plain text
    a server's concealing sequence in a bucket label is written as an escape."""
    servers = Servers()
    try:
        assert main(["show", "--url", servers.start(_Labels)]) == 0
    finally:
        servers.close()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out, repr(out)
    assert "64-127\\x1b[8mHIDDEN" in out and "EAGLE\\rFORGED" in out, out


def test_rich_tables_on_a_terminal_keep_their_colours_and_a_hostile_cell_is_escaped():
    """The escaping stream passes colour sequences (rich styles its tables with them on a terminal)
    and escapes every other control character, also inside a table cell."""
    import io

    from rich.console import Console
    from rich.table import Table

    from sglang_ctxprof.cli.main import Escaping

    buf = io.StringIO()
    t = Table("ctx", "label")
    t.add_row("64", HOSTILE)
    Console(file=Escaping(buf), force_terminal=True, color_system="standard", width=100).print(t)
    out = buf.getvalue()
    assert "\x1b[1m" in out  # the header's bold: passed as it is
    assert "\x1b]" not in out and "\x1b[2J" not in out and "\x07" not in out and "\r" not in out, repr(out)
    assert "\\x1b]0;owned" in out and "\\x1b[2J" in out  # (rich drops the bell and the carriage return)


# ------------------------------------------------------------------ files that cannot be written
FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sweep"


def test_an_unwritable_path_is_one_line_naming_it(capsys):
    assert main(["report", str(FIX / "baseline"), "--plots-dir", "/dev/null/x"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err and "/dev/null/x" in lines[0], err


def test_write_atomic_leaves_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    import errno

    from sglang_ctxprof.cli.main import write_atomic

    f = tmp_path / "t.json"
    f.write_text("old")

    def full(self, data, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as exc:
        write_atomic(f, "new")
    assert exc.value.filename == str(f) and f.read_text() == "old" and sorted(tmp_path.iterdir()) == [f]
