"""Fakes with the same shape as the SGLang objects our hooks touch (for pure unit tests only).

Real SGLang is tested on the real CPU server; these exist so the step life cycle, the fault guard
and the instrumentor can be checked in milliseconds with an injected clock.
"""

from __future__ import annotations

import time

from sglang_ctxprof.testing.fake_scheduler import FakeScheduler


class Mode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "DECODE"

    def is_extend(self):
        return self.name in ("EXTEND", "TARGET_VERIFY")

    def is_target_verify(self):
        return self.name == "TARGET_VERIFY"


class Req:
    def __init__(self, rid, prompt):
        self.rid = rid
        self.origin_input_ids = list(range(prompt))
        self.output_ids = [1]
        self.spec_verify_ct = 0
        self.finished_len = None
        self.max_new = 10**9

    @property
    def finished_reason(self):  # SGLang sets it when the request finishes; here: at max_new tokens
        return "length" if len(self.output_ids) >= self.max_new else None

    def finished(self):
        return self.finished_reason is not None


class Batch:
    def __init__(self, reqs, mode="DECODE"):
        self.reqs = reqs
        self.forward_mode = Mode(mode)
        self.forward_iter = 0


class Tensor:
    def __init__(self, vals):
        self.vals = vals
        self.is_cpu = True

    def tolist(self):
        return list(self.vals)


class Result:
    def __init__(self, accept):
        self.accept_lens = Tensor(accept)
        self.speculative_num_draft_tokens = 4


class ServerArgs:
    speculative_algorithm = "EAGLE"
    speculative_num_draft_tokens = 4
    device = "cpu"


class Worker:
    """The speculative worker: draft, verify (attention + MoE inside), draft_extend."""

    def __init__(self, sleep=0.0):
        self.sleep = sleep
        self.attn = Attn(sleep)
        self.moe = MoE(sleep)
        self.target = TargetWorker(self)

    def forward_batch_generation(self, batch):
        self.draft(batch)
        self.target.forward_batch_generation(batch, is_verify=True)
        self.draft_extend(batch)
        return Result([3] * len(batch.reqs))

    def draft(self, batch):
        time.sleep(self.sleep)

    def draft_extend(self, batch):
        time.sleep(self.sleep)


class TargetWorker:
    def __init__(self, outer):
        self.outer = outer

    def forward_batch_generation(self, batch, is_verify=False):
        self.outer.attn.forward()
        self.outer.moe.forward()
        time.sleep(self.outer.sleep)


class Attn:
    def __init__(self, sleep):
        self.sleep = sleep

    def forward(self):
        time.sleep(self.sleep)


class MoE:
    def __init__(self, sleep):
        self.sleep = sleep

    def forward(self):
        time.sleep(self.sleep)


# SGLang's Scheduler reduced to what the hooks touch: the one the benchmarks drive too.
Scheduler = FakeScheduler
