"""A toy DDTree-style speculative algorithm, ``TOY_DDTREE``, for testing sglang-ctxprof.

A real DDTree worker builds a draft tree from a block-diffusion drafter with its own code; ctxprof
knows none of its seams.  This toy stands in for it: it reuses SGLang's STANDALONE machinery (a
separate small draft model, tree drafting with ``--speculative-eagle-topk > 1``) under its own
class names (:mod:`toy_ddtree.worker`) and its own draft / draft-extend methods, which ctxprof does
not hook.  Verify still goes through SGLang's generic target worker.

With ``TOY_DDTREE_DECLARE_PHASES=1`` the worker declares its phases to ctxprof with
``sglang_ctxprof.phase("draft")`` / ``phase("draft_extend")``.

Loading: either ``pip install -e tests/plugins/toy_ddtree`` (entry point ``sglang.srt.plugins``),
or path-loaded as the tests do: put this folder and a folder holding a ``toy_ddtree-*.dist-info``
with the same entry point on ``PYTHONPATH`` (``write_dist_info`` in tests/conftest.py), so nothing is installed.
"""

from __future__ import annotations


NAME = "TOY_DDTREE"
DECLARE_ENV = "TOY_DDTREE_DECLARE_PHASES"


def register() -> None:
    """SGLang plugin entry point: register TOY_DDTREE (idempotent)."""
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    from . import worker  # noqa: F401 - import now: the worker keeps SGLang's original methods

    if spec_registry.get_spec(NAME) is not None:
        return

    class ToyDDTreeSpec(CustomSpecAlgo):
        """Behave like STANDALONE wherever SGLang branches on the algorithm (draft KV, loading)."""

        def is_standalone(self) -> bool:
            return True

        def __getattr__(self, name):
            # SGLang 0.5.23 calls spec-algorithm methods that CustomSpecAlgo lacks (e.g.
            # Scheduler.init_disaggregation -> carries_draft_hidden_states): answer as STANDALONE.
            if name.startswith("__"):
                raise AttributeError(name)
            return getattr(SpeculativeAlgorithm.STANDALONE, name)

    @SpeculativeAlgorithm.register(NAME, supports_overlap=True, spec_class=ToyDDTreeSpec)
    def _factory(server_args):
        return worker.ToyDDTreeWorker
