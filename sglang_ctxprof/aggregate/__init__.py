"""Aggregation, pure (the scheduler's drain thread, and the HTTP process when ranks are merged):
step records into context buckets, fits and per-request history.  Imports only ``model/``.
"""
