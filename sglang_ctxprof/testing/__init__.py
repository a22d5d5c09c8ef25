"""Test helpers shipped apart from the runtime (as ``structlog.testing`` is): the simulated CUDA
device that ``bench/gpu_check.py --dry-run`` and the unit tests drive.  Never imported by the runtime.
"""
