"""A stand-in for IPython on the GPU bundle: SGLang 0.5.16's ``sglang/utils.py`` imports
``IPython.display.HTML, display`` at import time (for notebooks only); IPython is not carried."""
