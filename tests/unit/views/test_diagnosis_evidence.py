"""views/diagnosis_evidence.py: a point's leaf phases are the step's (``records.leaf_phases``): a
forward without its attention/MoE split counts whole, a split one by its parts; a bucket with no
acceptance counted is no point, in a profile as in a sweep."""

from __future__ import annotations

import pytest

from sglang_ctxprof.views.diagnosis import diagnose
from sglang_ctxprof.views.diagnosis_evidence import evidence_from_profile, leaves
from sglang_ctxprof.views.profile import Profile


@pytest.mark.parametrize("ph, want", [
    ({"draft": 1.0, "verify": 3.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5, "overhead": 0.5},
     {"draft": 1.0, "verify_attn": 1.5, "verify_moe": 1.0, "verify_rest": 0.5, "overhead": 0.5}),
    ({"draft": 1.0, "verify": 3.0, "overhead": 0.5}, {"draft": 1.0, "verify": 3.0, "overhead": 0.5}),
    ({"decode": 9.0, "decode_attn": 4.0, "decode_moe": 3.0, "decode_rest": 2.0, "overhead": 1.0},
     {"decode_attn": 4.0, "decode_moe": 3.0, "decode_rest": 2.0, "overhead": 1.0}),
    ({"decode": 9.0, "overhead": 1.0, "step": 10.0, "host_gap": 0.2}, {"decode": 9.0, "overhead": 1.0}),
], ids=["spec-split", "spec-whole", "plain-split", "plain-whole"])
def test_leaves_count_a_forward_whole_without_its_split(ph, want):
    assert leaves(ph) == want


def test_a_bucket_without_acceptance_is_no_point_and_the_diagnosis_stands():
    """A saved body whose bucket lacks ``accepted`` (0) used to give AL 0 and a ZeroDivisionError
    in the diagnosis (a 500 on the server, a traceback in the CLI); a sweep's point is dropped so."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_http_plain import _agg
    from sglang_ctxprof.views.profile import build_profile

    body = build_profile(_agg(spec=True).snapshot()).to_dict(envelope=False)
    body["buckets"][0]["accepted"] = 0
    ev = evidence_from_profile(Profile.from_dict(body))
    assert body["buckets"][0]["label"] not in [p.label for p in ev.points] and len(ev.points) == 2
    assert all(p.al > 0 for p in ev.points)
    diagnose(ev)


def test_a_plain_sweeps_whole_decode_is_fitted_and_predicted():
    """A plain-decode sweep with no attention/MoE split: the what-if predicts its whole forward."""
    from sglang_ctxprof.views.diagnosis import diagnose, evidence_from_sweep

    rows = [{"ctx": c, "repeats": 1,
             "phases_ms": {"decode": {"median": 14.0 + c / 1e3, "spread": 0.0},
                           "overhead": {"median": 0.5, "spread": 0.0}, "step": {"median": 14.5 + c / 1e3, "spread": 0.0}}}
            for c in (1000, 2000, 4000)]
    ev = evidence_from_sweep(rows, {})
    assert "decode" in ev.fits
    assert diagnose(ev, ctx=3000)["whatif"]["at"]["step_ms"] == pytest.approx(17.5)
