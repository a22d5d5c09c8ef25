"""The ``sglang-ctxprof`` command line (the only place that configures logging globally)."""
