"""A stand-in for xgrammar on the GPU bundle (its wheel is 45 MB; not carried).

SGLang 0.5.16 imports ``from xgrammar import StructuralTag`` unguarded in
``function_call/inkling_detector.py`` (a return annotation only); elsewhere the import is guarded and
falls back to ``typing.Any``, which is what this stub gives.  Every other name raises ImportError, so
guarded imports take their fallback; the runner starts the server with ``--grammar-backend none``.
"""

from typing import Any

StructuralTag = Any
CTXPROF_STUB = True
