"""Renderers of a ``/ctx_profile`` body.  Each takes the public JSON dict and nothing else."""
