"""Collection, in the scheduler process, on the hot path: the SGLang adapter, the instrumentor, the
session that owns the lifecycle, the hooks, the profiler, clocks and the recorder.

Data leaves this room only as typed :class:`~sglang_ctxprof.model.records.StepRecord` objects,
through the recorder's bounded queue into ``aggregate/``.
"""
