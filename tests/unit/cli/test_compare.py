"""``compare`` and ``report`` on sweeps recorded from a real CPU server (tests/fixtures/sweep, see record.py).

* baseline vs longer (same server and build, one more, longer context): inherent context scaling, exit 0;
* baseline vs neighbor (another client's generation shares every decode batch): regression, exit 1;
* a run against itself: no phase changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ctxprof.cli.main import main

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sweep"


def _compare(a: str, b: str, capsys) -> tuple[int, dict, str]:
    rc = main(["compare", str(FIX / a), str(FIX / b), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == out["exit_code"]
    rc_text = main(["compare", str(FIX / a), str(FIX / b)])
    text = capsys.readouterr().out
    assert rc_text == rc
    return rc, out, text


def test_fixtures_are_real_recorded_runs():
    for run in ("baseline", "longer", "neighbor"):
        meta = json.loads((FIX / run / "meta.json").read_text())
        assert meta["recorded_by"] == "tests/fixtures/sweep/record.py"
        pts = [json.loads(p.read_text()) for p in (FIX / run).glob("point-*.json")]
        assert len(pts) == 3 * len(meta["ctx"])
        assert all(p["prompt_tokens"] == p["ctx"] and p["breakdown"]["steps"] > 0 for p in pts)


def test_longer_context_is_inherent_scaling(capsys):
    rc, out, text = _compare("baseline", "longer", capsys)
    assert rc == 0 and out["verdict"] == "inherent context scaling", out["why"]
    assert any(c["ctx"] == 5120 and c["source"] == "A fit" for c in out["checks"])
    assert out["scaling"]["slopes"]["verify_attn"] > 0
    assert "verdict: inherent context scaling" in text


def test_shared_batches_are_a_regression(capsys):
    rc, out, text = _compare("baseline", "neighbor", capsys)
    assert rc == 1 and out["verdict"] == "regression"
    worse = {c["quantity"] for c in out["checks"] if c["status"] == "worse"}
    assert "step" in worse
    assert "verdict: regression" in text


def test_run_against_itself(capsys):
    rc, out, _ = _compare("baseline", "baseline", capsys)
    assert rc == 0 and all(c["status"] in ("same", "(same)") for c in out["checks"])


def test_report_offline(tmp_path, capsys):
    assert main(["report", str(FIX / "longer"), "--plots-dir", str(tmp_path)]) == 0
    assert "5120" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["accept.png", "decode_tok_s.png", "overview.png", "phase_ms.png"]
    assert (tmp_path / "summary.csv").exists()


@pytest.mark.parametrize("argv", [["compare", "/nonexistent", "/nonexistent"], ["report", "/nonexistent"]])
def test_missing_dir_is_one_line_error(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def _only(tmp_path: Path, run: str, ctx: int) -> Path:
    """A copy of a recorded run with only the points at ``ctx``."""
    import shutil

    d = tmp_path / f"{run}-{ctx}"
    d.mkdir()
    shutil.copy(FIX / run / "meta.json", d)
    for p in (FIX / run).glob(f"point-c{ctx:06d}-r*.json"):
        shutil.copy(p, d)
    return d


def test_runs_with_nothing_comparable_exit_2_and_say_why(tmp_path, capsys):
    a, b = _only(tmp_path, "baseline", 64), _only(tmp_path, "longer", 5120)
    assert main(["compare", str(a), str(b), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "nothing comparable" and out["checks"] == [] and out["exit_code"] == 2
    assert main(["compare", str(a), str(b)]) == 2
    text = capsys.readouterr().out
    assert "verdict: nothing comparable" in text and "5120" in text and "no significant change" not in text
    assert main(["diagnose", str(b), "--baseline", str(a)]) == 2
    assert "nothing comparable" in capsys.readouterr().out


def test_names_with_brackets_print_as_they_are(tmp_path, capsys):
    """A folder name and a model path are text, not rich markup: ``[/x]`` neither fails nor vanishes, and
    a ``$`` pair in the model name does not break the plots' titles."""
    import shutil

    a, b = tmp_path / "br[/x]" / "a", tmp_path / "[exp1]"
    shutil.copytree(FIX / "baseline", a)
    shutil.copytree(FIX / "baseline", b)
    meta = json.loads((b / "meta.json").read_text())
    meta["model_path"] = "org/$\\frac{$x[/]y [bold red]evil[/]"
    (b / "meta.json").write_text(json.dumps(meta))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr()
    assert "br[/x]" in out.out and "Traceback" not in out.err, out.err
    assert main(["report", str(b), "--plots-dir", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr()
    assert "[exp1]" in out.out and "[bold red]evil[/]" in out.out, out.out
    assert "error" not in out.err, out.err
    assert len(list((tmp_path / "plots").glob("*.png"))) >= 2
