"""views/otel_export: our provider's setup is undone by its shutdown, and its log filter mutes the
OTLP exporters' own lines only while our export runs, on the thread that runs it."""

from __future__ import annotations

import logging

from test_otel_whole import _Recording, _request

from sglang_ctxprof.views.otel import OtelView
from sglang_ctxprof.views.otel_export import _EXPORTER_LOGGERS, build_provider


def test_shutdown_takes_our_filter_off_the_exporters_loggers_and_a_flush_caller_is_never_muted(caplog):
    before = {n: list(logging.getLogger(n).filters) for n in _EXPORTER_LOGGERS}
    for _ in range(2):  # a second session in the same process
        exp = _Recording()
        exp.release.set()
        view = OtelView(*build_provider({"OTEL_SERVICE_NAME": "t"}, exporter=exp, queue=64))
        view.export_request(_request("r", 1))
        view.flush()  # the SDK may export on the caller's thread: it is not ours for good
        with caplog.at_level(logging.WARNING):
            logging.getLogger(_EXPORTER_LOGGERS[0]).warning("SGLang's own exporter, on this thread")
        assert "SGLang's own exporter" in caplog.text
        caplog.clear()
        view.shutdown()
        assert {n: list(logging.getLogger(n).filters) for n in _EXPORTER_LOGGERS} == before
