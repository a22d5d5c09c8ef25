"""sglang-ctxprof: a profiler inside SGLang for speculative decoding at long context.

Public API (cheap to import; pulls in nothing of SGLang, torch or OTel):

* :func:`phase` - a context manager a custom speculative worker uses to declare its own phases
  (``draft``, ``verify``, ``draft_extend``) to ctxprof; a no-op when profiling is off.
* ``__version__``.

The SGLang plugin entry point is :func:`sglang_ctxprof.plugin.register`.
"""

from __future__ import annotations

from .api import phase

__version__ = "0.1.0"
__all__ = ["phase", "__version__"]
