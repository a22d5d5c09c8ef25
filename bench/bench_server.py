"""The real server the bench scripts measure, started one way: the tiny EAGLE model, SGLang on the CPU.

:func:`start_server` builds (or reuses, from ``.cache/models/deepseek-v3-eagle-ha``) the tiny
random-weight deepseek-v3 with a high-acceptance EAGLE draft (``cli.tiny_model``), then starts
SGLang on it through ``cli.server.ServerProcess`` with ``cpu_args(..., algorithm="EAGLE")`` and
``--enable-ctx-profile``, its output in ``log_path``, and waits until it answers (up to 900 s: a
loaded 2-core machine).  The caller owns the started server: ``srv.url`` to measure, ``srv.stop()``
at the end.  The server's code is whatever ``sglang_ctxprof`` the calling script imports (its own
``sys.path`` decides: a ``PYTHONPATH`` revision where it appends the checkout).  Used by
``read_latency.py``, ``reader_stall.py`` and ``capture_gap.py``; run them under the server lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Union

if TYPE_CHECKING:
    from sglang_ctxprof.cli.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / ".cache" / "models" / "deepseek-v3-eagle-ha"
START_TIMEOUT_S = 900.0


def start_server(log_path: Union[str, Path], env: Optional[Mapping[str, str]] = None, quiet: bool = True,
                 freeze_gc: bool = True, extra_args: Sequence[str] = ()) -> "ServerProcess":
    """Build the tiny model if needed, start the server with ``--enable-ctx-profile`` and wait for it.
    ``env``: extra variables for the server's processes; ``quiet``: no tiny-model build messages
    (``CTXPROF_QUIET``, unless already set); ``freeze_gc``: ``ServerProcess``'s (SGLang's
    ``freeze_gc`` once the server is up); ``extra_args``: after the others (a repeated flag's last
    value wins)."""
    from sglang_ctxprof.cli.server import ServerProcess, cpu_args
    from sglang_ctxprof.cli.tiny_model import TinyModelArgs, build

    if quiet:
        os.environ.setdefault("CTXPROF_QUIET", "1")
    m = build(TinyModelArgs(arch="deepseek-v3", out=str(MODEL_DIR), draft="eagle", high_acceptance=True))
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    args = cpu_args(m["target"], algorithm="EAGLE", draft=m["draft"]) + ["--enable-ctx-profile", *extra_args]
    srv = ServerProcess(args, log_path=str(log_path), timeout=START_TIMEOUT_S, env=env, freeze_gc=freeze_gc)
    srv.start()
    return srv
