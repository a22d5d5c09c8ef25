"""``demo``'s arms: both by default (what ``make demo`` runs), ``--arms spec`` alone, and a re-run that
replaces the previous demo's folder, whichever kind it was.  The server-launching parts are replaced:
these check what the demo asks of the sweep."""

from __future__ import annotations

import argparse
import json

import pytest

from sglang_ctxprof.cli import demo


def _ns(tmp_path, *argv):
    ap = argparse.ArgumentParser()
    demo.add_cli_args(ap)
    return ap.parse_args(["--out", str(tmp_path / "sweep"), "--models", str(tmp_path / "models"), *argv])


@pytest.fixture
def asked(monkeypatch, tmp_path):
    got = {}
    monkeypatch.setattr(demo, "build", lambda a: {"target": str(tmp_path / "t"), "draft": str(tmp_path / "d")})

    def fake_run_args(args, after=None):
        got["args"], got["after"] = args, after
        return 0

    monkeypatch.setattr(demo, "run_args", fake_run_args)
    return got


def test_default_runs_both_arms_without_the_sustained_run(tmp_path, asked):
    assert demo.run(_ns(tmp_path)) == 0
    a = asked["args"]
    assert a.arms == ["spec", "plain"] and a.sustained == 0 and not a.plots and a.launch
    assert "--speculative-algorithm" in a.server_args
    assert asked["after"] is demo._servers_ledger


def test_spec_alone_keeps_the_sustained_run_and_the_plots(tmp_path, asked):
    assert demo.run(_ns(tmp_path, "--arms", "spec")) == 0
    a = asked["args"]
    assert a.arms == [] and a.sustained == 256 and a.plots
    assert asked["after"] is demo._server_profile


def _meta(tmp_path, model: str = "models/deepseek-v3-eagle-ha/target") -> str:
    """A sweep's meta.json, of a model under the demo's --models folder (tmp_path/models) by default."""
    return json.dumps({"schema": "ctxprof-sweep/1", "model_path": str(tmp_path / model)})


def _write(out, names, text) -> None:
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


def _files(out) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("left", ["meta.json", "spec/meta.json"])
def test_a_rerun_replaces_the_previous_demo_folder(tmp_path, asked, left):
    out = tmp_path / "sweep"
    _write(out, [left, left.replace("meta.json", "point-c000064-r00.json")], _meta(tmp_path))
    assert demo.run(_ns(tmp_path)) == 0
    assert _files(out) == [] and not (out / "spec").exists()


def test_a_rerun_removes_only_what_a_demo_writes(tmp_path, asked):
    """``--out`` may name a folder that holds other things beside a previous demo's results (``--out .``
    in a project): they stay, the project's own meta.json, summary and plots among them when the demo
    there was an arms one (its sweeps are in spec/ and plain/)."""
    out = tmp_path / "sweep"
    _write(out, ["arms.json", "spec-server.log", "spec/meta.json", "spec/point-c000064-r01.json",
                 "spec/point-c000064-r00.json.tmp", "plain/meta.json", "plain/summary.json",
                 "plain/table.txt", "plain/decode_tok_s.png"], _meta(tmp_path))
    keep = ["src/code.py", "notes.txt", "spec/mine.txt", "logo.png", "build.tmp", "meta.json", "summary.json",
            "table.txt", "decode_tok_s.png"]
    _write(out, keep, json.dumps({"name": "my project"}))
    assert demo.run(_ns(tmp_path)) == 0
    assert _files(out) == sorted(keep) and not (out / "plain").exists()
    one = tmp_path / "one"  # a one-arm demo's folder: its files at the top, and a killed write's .tmp
    _write(one, ["meta.json", "summary.csv", "table.txt", "accept.png", "point-c000064-r00.json",
                 "sustained-c000064.json.tmp"], _meta(tmp_path))
    _write(one, ["logo.png"], "mine")
    demo.clear_previous(one, tmp_path / "models")
    assert _files(one) == ["logo.png"]


@pytest.mark.parametrize("meta", [{"name": "my project"}, {"schema": "ctxprof-sweep/1", "model_path": "/srv/m"}])
def test_a_folder_that_is_not_a_demos_is_left_alone(tmp_path, asked, meta):
    """A meta.json of a project's own, or a sweep of the user's own model: nothing of it is removed (the
    sweep then refuses a folder that holds results, unless --resume)."""
    out = tmp_path / "sweep"
    _write(out, ["meta.json", "summary.json", "logo.png", "table.txt", "point-c000064-r00.json"], json.dumps(meta))
    assert demo.run(_ns(tmp_path)) == 0
    assert _files(out) == ["logo.png", "meta.json", "point-c000064-r00.json", "summary.json", "table.txt"]


class _Client:
    """What the servers' own view asks of a server's client, recorded in one shared log."""

    def __init__(self, arm: str, log: list) -> None:
        self.arm, self.log = arm, log

    def profile_reset(self) -> bool:
        self.log.append(("reset", self.arm))
        return True

    def generate(self, ids, n):
        self.log.append(("generate", self.arm, len(ids), n))
        return {}, 0.0

    def profile(self):
        self.log.append(("profile", self.arm))
        return None  # no profile: the view stops before the diagnosis


def test_the_servers_own_view_interleaves_the_two_servers_per_context():
    """A shared machine's slow stretch must fall on both arms alike: both profiles are emptied
    first, then each context's requests alternate spec, plain, plain, spec."""
    log: list = []
    clients = {"spec": _Client("spec", log), "plain": _Client("plain", log)}
    demo._servers_ledger(argparse.Namespace(ctx=[64, 1024]), clients)
    assert log[:2] == [("reset", "spec"), ("reset", "plain")]
    gens = [(arm, ctx) for kind, arm, *rest in log if kind == "generate" for ctx in rest[:1]]
    assert gens == [("spec", 64), ("plain", 64), ("plain", 64), ("spec", 64),
                    ("spec", 1024), ("plain", 1024), ("plain", 1024), ("spec", 1024)]
    assert log[-2:] == [("profile", "spec"), ("profile", "plain")]
