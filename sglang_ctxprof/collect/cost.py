"""What profiling costs, measured by the profiler itself while it runs (cheap enough to leave on).

* **Scheduler thread**: on one step in :data:`SAMPLE_EVERY`, every hook adds the time its own code
  took (``time.perf_counter_ns``, monotonic) to the step's builder: the ``run_batch`` hook before
  and after SGLang's call, each timed region's marks (step span, phases, attention/MoE blocks) and
  the ``process_batch_result`` hook before and after SGLang's processing.  What is not counted: the
  wrapper call itself (one Python call per hooked function) and hooks that pass straight through.
* **Drain thread**: every record's build, aggregation and sinks, and its wake-ups to look for work,
  timed by the recorder in the thread's own CPU time (``time.thread_time_ns``: time spent waiting
  for the GIL is not ours).  A wake-up costs a few system calls and a GIL hand-over (tens of µs),
  so an idle server's wake-ups raise the per-record figure of the records that follow.  Per
  record too: the drain's wake-ups that found nothing (``pacing.Looks``) and its pauses between
  two slices of work (``pacing.Pacer``), the hand-overs that cost it most.
* **Events per step** on a GPU: CUDA events recorded by the step's marks (two per timed region);
  None on the CPU clock.
* **Step share**: scheduler-thread cost over the mean step time of the same sampled steps.
* **Drain share**: the drain thread's CPU per record (one record per step) over that mean step.
  The drain thread shares the scheduler thread's GIL, so this is what it can take from the
  scheduler's step: all of it while the scheduler thread runs Python, less while it waits on a
  device or a torch op that releases the GIL.  **Total share**: the two together, the profiler's
  cost per step in the scheduler's process (``bench/overhead.py`` measures what it costs decode
  throughput; the scheduler thread's share alone understated it).

Counters only grow; ``to_dict()`` is the ``cost`` key of a rank's status.  Before any step is timed
the shares are None (no step to compare with), not 0.
"""

from __future__ import annotations

from typing import Any, Optional

SAMPLE_EVERY = 16  # one step in 16 is timed on the scheduler thread


class Cost:
    __slots__ = ("steps", "sched_ns", "sched_steps", "step_ms", "step_n", "drain_ns", "drain_records",
                 "events", "wakes", "pauses")

    def __init__(self) -> None:
        self.steps = 0
        self.sched_ns = 0
        self.sched_steps = 0
        self.step_ms = 0.0
        self.step_n = 0
        self.drain_ns = 0
        self.drain_records = 0
        self.events: Optional[int] = None
        self.wakes = 0  # the drain thread's sleeps that ended in a look (pacing.Looks)
        self.pauses = 0  # its pauses between two slices (pacing.Pacer), as the recorder last read them

    def sample(self) -> bool:
        """Whether the step being started is one of the timed ones."""
        self.steps += 1
        return self.steps % SAMPLE_EVERY == 0

    def add_sched(self, ns: int) -> None:
        self.sched_ns += ns
        self.sched_steps += 1

    def add_step(self, step_ms: float, events: Optional[int]) -> None:
        self.step_ms += step_ms
        self.step_n += 1
        if events is not None:
            self.events = events

    def add_drain(self, ns: int, records: int = 1) -> None:
        self.drain_ns += ns
        self.drain_records += records

    def to_dict(self) -> dict[str, Any]:
        us = self.sched_ns / 1e3 / self.sched_steps if self.sched_steps else 0.0
        step_us = self.step_ms * 1e3 / self.step_n if self.step_n else 0.0
        records = self.drain_records
        drain_us = self.drain_ns / 1e3 / records if records else 0.0
        timed = step_us > 0  # no step timed yet: no share to give (None, not a measured 0)
        step_share = us / step_us if timed else None
        drain_share = drain_us / step_us if timed else None
        return {
            "sched_us_per_step": us,
            "sampled_steps": self.sched_steps,
            "drain_us_per_record": drain_us,
            "drain_wakes_per_record": self.wakes / records if records else 0.0,
            "drain_pauses_per_record": self.pauses / records if records else 0.0,
            "events_per_step": self.events,
            "step_share": step_share,
            "drain_share": drain_share,
            "total_share": step_share + drain_share if timed else None,
        }
