"""A stand-in for flashinfer on the GPU bundle (bench/gpu_sglang): flashinfer is not carried.

Strict on purpose.  SGLang 0.5.16 imports a few flashinfer names *unguarded* on CUDA; only those
(``ALLOW``) import, as placeholders that raise when called, so a code path that really needs
flashinfer fails loudly, naming the function.  Every other ``from flashinfer... import X`` raises
ImportError, so SGLang's guarded imports take their fallback (e.g. ``layers/moe/topk.py`` falls back
from flashinfer's ``fused_topk_deepseek`` to its own grouped top-k only when the import fails).
``SGLANG_IS_FLASHINFER_AVAILABLE=false`` keeps SGLang's own availability checks off; the runner uses
``--attention-backend triton --sampling-backend pytorch``.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+ctxprof-stub"
CTXPROF_STUB = True

# module -> names SGLang 0.5.16 imports from it without a guard on the CUDA path
ALLOW = {
    # layers/sampler.py (module level, under is_cuda()); used only by --sampling-backend flashinfer
    "flashinfer.sampling": {"min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs"},
    # layers/attention/vision.py (module level, under is_cuda()): vision towers only
    "flashinfer.prefill": {"cudnn_batch_prefill_with_kv_cache"},
}


class _Missing:
    def __init__(self, name):
        self._name = name

    def __call__(self, *a, **k):
        raise RuntimeError(f"{self._name}: flashinfer is not installed (ctxprof GPU bundle stub)")

    def __repr__(self):
        return f"<flashinfer stub {self._name}>"


def _getattr_for(modname):
    allowed = ALLOW.get(modname, set())

    def __getattr__(name):
        if name in allowed:
            return _Missing(f"{modname}.{name}")
        raise AttributeError(f"module {modname!r} has no attribute {name!r} (ctxprof GPU bundle stub)")
    return __getattr__


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _getattr_for(spec.name)
        m.CTXPROF_STUB = True
        return m

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in ALLOW:
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


if not any(type(f).__name__ == "_Finder" and type(f).__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

__getattr__ = _getattr_for("flashinfer")
