"""``sglang-ctxprof trace`` prints a server-supplied rid with its control characters escaped."""

from __future__ import annotations

from sglang_ctxprof.cli.trace import printable, render_request


def test_terminal_escapes_in_a_rid_print_escaped():
    r = {"rid": "evil\x1b]0;owned\x07\nnext\u202e", "steps": 0, "step_rows": []}
    out = render_request(r)
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert out.splitlines()[0] == "request evil\\x1b]0;owned\\x07\\nnext\\u202e"


def test_printable_text_is_kept():
    assert printable("req-1:é.ü") == "req-1:é.ü"
