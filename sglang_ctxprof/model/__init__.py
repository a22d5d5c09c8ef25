"""The data model, pure: names, configuration, records, buckets, statistics, roofline, guard.

Runs in every process.  Imports nothing outside ``model/`` (no SGLang, torch or OTel).
"""
