"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``ctxprof``).

SGLang calls :func:`register` in every process that runs ``load_plugins()``.  With neither
``--enable-ctx-profile`` on the command line nor ``SGLANG_CTX_PROFILE=1`` in the environment it
returns at once and installs nothing, so SGLang runs exactly as without the plugin.  Otherwise it
picks its work by process role:

* main (HTTP) process: accept the flag (an AFTER hook on ``ServerArgs.add_cli_args``), export
  ``SGLANG_CTX_PROFILE=1`` so spawned schedulers inherit it, and add the ``/ctx_profile`` routes;
* scheduler processes: build the :class:`~sglang_ctxprof.collect.profiler.Profiler` and instrument;
* detokenizer, DP controller and anything else: nothing.

It never raises: a failure is logged and SGLang starts without profiling.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from types import FrameType
from typing import TYPE_CHECKING, Optional

from .collect import adapter, hooks
from .model import names
from .model.config import CtxProfConfig, env_enabled

if TYPE_CHECKING:
    from .views.exporters import Exporters

logger = logging.getLogger(__name__)


_BAD_CONFIG: str | None = None  # set when the main process found a bad SGLANG_CTXPROF_* value


def register() -> None:
    try:
        _register()
    except Exception:  # noqa: BLE001 - a profiler must never stop the server from starting
        logger.exception("sglang-ctxprof: plugin failed to load; SGLang continues without profiling")


def flag_requested(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    return names.CLI_FLAG in argv or env_enabled()


def help_requested(argv: list[str] | None = None) -> bool:
    argv = sys.argv if argv is None else argv
    return "-h" in argv or "--help" in argv


def process_role() -> str:
    if multiprocessing.parent_process() is None:
        return "main"
    f: Optional[FrameType] = sys._getframe()
    while f is not None:
        if f.f_code.co_name == "run_scheduler_process":
            return "scheduler"
        f = f.f_back
    return "other"


def _register() -> None:
    if not flag_requested():
        if help_requested() and process_role() == "main":
            _register_cli_hooks()  # only so that `--help` lists --enable-ctx-profile
        return
    role = process_role()
    if role == "main":
        _register_cli_hooks()  # first: the flag must parse even if the configuration below is bad
        try:
            CtxProfConfig.from_env()  # every SGLANG_CTXPROF_* variable
        except ValueError as exc:
            # Checked once, here, before any scheduler is spawned: profiling stays off everywhere
            # (the schedulers do not inherit the switch) and SGLang serves as without the plugin.
            global _BAD_CONFIG
            _BAD_CONFIG = str(exc)
            os.environ.pop(names.ENV_ENABLE, None)
            logger.error("sglang-ctxprof: bad configuration, profiling is OFF: %s", exc)
            return
        os.environ[names.ENV_ENABLE] = "1"
        # multi-tokenizer HTTP workers import the app by path (0.5.23, or the multi-tokenizer-app-path patch)
        os.environ.setdefault(names.ENV_SGLANG_APP_PATH, names.HTTP_APP_PATH)
        install_http_routes()
    elif role == "scheduler":
        install_scheduler()


def install_http_routes(app=None) -> None:
    """HTTP process: the ``/ctx_profile`` routes on SGLang's app, reaching the schedulers through
    a control client built on the adapter's SGLang seams."""
    from .control.client import ControlClient
    from .views.http import install_routes

    if app is None:
        app = adapter.http_app()
    config = CtxProfConfig.from_env()
    install_routes(app, ControlClient(adapter.tokenizer_manager, adapter.make_control_request,
                                      timeout_s=config.control_timeout_s), adapter.admin_auth(), config)


def _register_cli_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", _add_flag, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", _keep_flag, HookType.AFTER)


def _add_flag(result, parser, *args, **kwargs):
    try:
        parser.add_argument(names.CLI_FLAG, action="store_true", default=False,
                            help="sglang-ctxprof: profile speculative decode steps by context length "
                                 "(GET /ctx_profile). Same as SGLANG_CTX_PROFILE=1.")
    except Exception:  # noqa: BLE001 - already added (argparse conflict)
        pass
    return None


def _keep_flag(result, *args, **kwargs):
    try:
        ns = args[-1] if args else kwargs.get("args")
        if getattr(ns, names.CLI_DEST, False) and _BAD_CONFIG is None:
            os.environ[names.ENV_ENABLE] = "1"
            setattr(result, names.SERVER_ARGS_ATTR, True)
    except Exception:  # noqa: BLE001
        pass
    return None


def install_scheduler() -> None:
    """Scheduler process: one :class:`CtxProfSession` instruments SGLang, with the exporters."""
    from .collect.session import CtxProfSession

    if hooks.SESSION is not None:
        return
    version = adapter.sglang_version()
    why = adapter.support_message(version)
    if why:
        logger.warning("sglang-ctxprof: %s", why)
    for limit in adapter.release_limits(version):
        logger.info("sglang-ctxprof: on SGLang %s: %s", version, limit)
    session = CtxProfSession(CtxProfConfig.from_env(), exporters=_exporters)
    report = session.instrument()
    ok = sum(1 for v in report.values() if v == "ok")
    bad = {k: v for k, v in report.items() if v != "ok"}
    logger.info("sglang-ctxprof: profiling on in pid %d (sglang %s): %d hooks installed; not hooked: %s",
                os.getpid(), version, ok, ", ".join(f"{k.rsplit('.', 2)[-2]}.{k.rsplit('.', 1)[-1]}"
                                                    for k in bad) or "none")


def _exporters(config: CtxProfConfig) -> Optional[Exporters]:
    """The session's exporter factory: OTel spans, structlog events and live Prometheus metrics
    (what they learn from the scheduler reaches them when the profiler binds: ``BindFacts``)."""
    from .views.exporters import install

    return install(config)
