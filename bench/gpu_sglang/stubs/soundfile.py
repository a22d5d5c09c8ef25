"""A stand-in for soundfile on the GPU bundle: SGLang 0.5.16 imports it at the top of
``entrypoints/openai/serving_transcription.py`` (audio transcription only); the real one needs cffi,
which the GPU machine lacks.  Any use raises."""

CTXPROF_STUB = True


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(f"soundfile.{name}: soundfile is not installed (ctxprof GPU bundle stub)")
