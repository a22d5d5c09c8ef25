"""``testing/fake_cuda`` follows what the H200 did where our timing code relies on it (probe P6)."""

from __future__ import annotations

import gc

import pytest

from sglang_ctxprof.testing.fake_cuda import FakeDevice


def timed_graph(dev, ms):
    """A graph timing one ``ms`` kernel between two external events (the events are returned too)."""
    start, end = dev.Event(enable_timing=True, external=True), dev.Event(enable_timing=True, external=True)
    g = dev.CUDAGraph()
    with dev.graph(g):
        start.record()
        dev.kernel(ms)
        end.record()
    return g, start, end


def test_a_replay_records_into_whatever_event_took_a_freed_handle():
    """P6 on the H200: deleting a graph's events, then replaying, raised nothing; events created
    after the delete got the freed handles and the replay overwrote their times."""
    dev = FakeDevice()
    g, start, end = timed_graph(dev, 1.0)
    del start, end
    gc.collect()
    fresh = [dev.Event(enable_timing=True) for _ in range(2)]
    for ev in fresh:
        ev.record()
    dev.synchronize()
    assert fresh[0].elapsed_time(fresh[1]) == 0.0
    g.replay()  # no error, as on the device
    dev.synchronize()
    assert abs(fresh[0].elapsed_time(fresh[1])) == pytest.approx(1.0)  # overwritten by the replay
    assert dev.stray_records == 2


def test_a_replay_of_live_events_is_not_stray():
    dev = FakeDevice()
    g, start, end = timed_graph(dev, 2.0)
    g.replay()
    dev.synchronize()
    assert start.elapsed_time(end) == pytest.approx(2.0) and dev.stray_records == 0


def test_what_cuda_forbids_during_a_capture_raises_as_cuda_does():
    """Global capture mode (``torch.cuda.graph``'s default): a synchronize or a query while any
    stream captures fails in CUDA (and spoils the capture).  A fake that allowed it would let a
    regression that reads events inside a capture pass every CPU test and fail on the GPU."""
    dev = FakeDevice()
    before = dev.Event(enable_timing=True)
    before.record()
    side = dev.Stream("side")
    g = dev.CUDAGraph()
    with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureInvalidated"):  # caught inside: still spoiled
        with dev.graph(g):
            for call in (dev.synchronize, before.query, before.synchronize, side.query, side.synchronize):
                with pytest.raises(RuntimeError, match="cudaErrorStreamCaptureUnsupported"):
                    call()
            dev.kernel(1.0)
    assert dev.syncs == 0 and dev.capturing == 0 and dev.queries == 0
    with dev.graph(dev.CUDAGraph()):  # the next capture is clean
        dev.kernel(1.0)
    dev.synchronize()  # after the capture: allowed again
    assert before.query() and side.query() and dev.syncs == 1
