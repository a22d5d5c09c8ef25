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


def _row(i, **ph):
    return {"step_id": i, "ctx_len": 100 + i, "batch_size": 1, "draft_tokens": 0, "accepted": 1, "committed": 1,
            "step_ms": sum(v for k, v in ph.items() if k in ("decode_attn", "decode_moe", "decode_rest", "overhead",
                                                              "draft", "verify", "draft_extend")),
            "phases_ms": ph}


def test_a_plain_steps_decode_and_its_split_are_columns():
    """A plain-decode request: its forward's parts are shown (and nothing speculative)."""
    r = {"rid": "p", "steps": 2, "step_rows": [_row(1, decode=6.0, decode_attn=2.0, decode_moe=3.0, decode_rest=1.0,
                                                      overhead=0.5)] * 2}
    lines = render_request(r).splitlines()
    head = lines[1].split() if lines[1].lstrip().startswith("#") else next(ln.split() for ln in lines if "step_ms" in ln)
    assert head[-5:] == ["decode", "dec.attn", "dec.moe", "dec.rest", "other"] and "verify" not in head
    row = lines[-1].split()
    assert row[-5:] == ["6.000", "2.000", "3.000", "1.000", "0.500"]


def test_a_speculative_steps_columns_are_as_before():
    r = {"rid": "s", "steps": 1, "step_rows": [_row(1, draft=3.0, verify=8.0, verify_attn=5.0, verify_moe=2.0,
                                                      verify_rest=1.0, draft_extend=1.0, overhead=0.5)]}
    head = next(ln.split() for ln in render_request(r).splitlines() if "step_ms" in ln)
    assert head[8:] == ["draft", "verify", "v.attn", "v.moe", "v.rest", "d_ext", "other"]


def test_a_request_whose_rows_a_slowest_read_left_out_says_how_to_read_them():
    r = {"rid": "big", "steps": 9000, "step_rows_left_out": 4096}
    out = render_request(r)
    assert "4096 step rows left out of this read" in out and "sglang-ctxprof trace big" in out
