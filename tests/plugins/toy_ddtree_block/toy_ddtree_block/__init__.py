"""A toy DDTree-style algorithm on SGLang's block drafter, ``TOY_DDTREE_BLOCK``, for testing sglang-ctxprof.

A DDTree worker drafts with a block-diffusion drafter (DFlash) and builds its own draft tree from
the block's per-position distributions.  This toy is what such a user's plugin looks like: it is
registered with ``SpeculativeAlgorithm.register`` under its own name, its worker subclasses SGLang's
``DFlashWorkerV2`` (the drafter, its KV cache and the target's aux hidden states are DFLASH's), and
its decode step is its own (:mod:`toy_ddtree_block.worker`): its own proposal from the block and
its own draft-KV append, which ctxprof does not hook.  Verify still goes through SGLang's generic
target worker.

With ``TOY_DDTREE_BLOCK_DECLARE_PHASES=1`` the worker declares its phases to ctxprof with
``sglang_ctxprof.phase("draft")`` / ``phase("draft_extend")``.

SGLang branches on the algorithm in two ways: ``spec_algorithm.is_dflash()`` and friends (answered
here as DFLASH: the spec class delegates every such question, argument handling included, to
``SpeculativeAlgorithm.DFLASH``), and ``server_args.speculative_algorithm == "DFLASH"`` by name
(only for features this toy does not use: unified memory, CP/TP sharing, block verification,
aux-hidden-state export).  On a CPU it needs tests/plugins/cpu_dflash loaded too, as DFLASH does.

Loading: either ``pip install -e tests/plugins/toy_ddtree_block`` (entry point
``sglang.srt.plugins``), or path-loaded as the tests do: put this folder and a folder holding a
``toy_ddtree_block-*.dist-info`` with the same entry point on ``PYTHONPATH`` (``write_dist_info`` in tests/conftest.py).
"""

from __future__ import annotations


NAME = "TOY_DDTREE_BLOCK"
DECLARE_ENV = "TOY_DDTREE_BLOCK_DECLARE_PHASES"


def register() -> None:
    """SGLang plugin entry point: register TOY_DDTREE_BLOCK (idempotent)."""
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    from . import worker  # noqa: F401 - import now: the worker keeps SGLang's original methods

    if spec_registry.get_spec(NAME) is not None:
        return

    dflash = SpeculativeAlgorithm.DFLASH

    class ToyDDTreeBlockSpec(CustomSpecAlgo):
        """Answer as DFLASH wherever SGLang asks the algorithm (KV sizing, aux hidden capture,
        ``_handle_dflash`` argument resolution, ...); only the worker factory is ours."""

        def __getattr__(self, name):
            # methods the enum has and CustomSpecAlgo lacks (e.g. carries_draft_hidden_states)
            if name.startswith("__"):
                raise AttributeError(name)
            return getattr(dflash, name)

    for attr, value in vars(CustomSpecAlgo).items():
        if callable(value) and not attr.startswith("_") and attr != "create_worker" and hasattr(dflash, attr):
            setattr(ToyDDTreeBlockSpec, attr, _delegate(dflash, attr))

    @SpeculativeAlgorithm.register(NAME, supports_overlap=True, spec_class=ToyDDTreeBlockSpec)
    def _factory(server_args):
        return worker.ToyDDTreeBlockWorker


def _delegate(target, attr: str):
    def method(self, *args, **kwargs):
        return getattr(target, attr)(*args, **kwargs)

    method.__name__ = attr
    return method
