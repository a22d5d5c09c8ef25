# Shared tail of the launch/ recipes (sourced, not run).  Each recipe fills the bash array ARGS
# with SGLang server arguments and sources this file, which:
#   * adds --enable-ctx-profile (the profiler; GET /ctx_profile on the server's port);
#   * adds SGLang's own Prometheus metrics (--enable-metrics: GET /metrics) and, when
#     OTEL_EXPORTER_OTLP_ENDPOINT / CTXPROF_OTLP is set, SGLang's OTel tracing (--enable-trace
#     --otlp-traces-endpoint); ctxprof then attaches its slow-request/step spans
#     (SGLANG_CTXPROF_TRACE=slow|all, default slow when tracing is on);
#   * passes any extra command-line arguments through, after ours (later flags win);
#   * with CTXPROF_PRINT_ARGS=1 prints the final argument list, one per line, and exits
#     (used by tests/unit/test_launch_recipes.py, which parses it with SGLang's prepare_server_args);
#   * otherwise execs ${PYTHON:-python} -m sglang.launch_server "${ARGS[@]}".
ARGS+=(--enable-ctx-profile --enable-metrics)
OTLP="${CTXPROF_OTLP:-${OTEL_EXPORTER_OTLP_ENDPOINT:-}}"
if [[ -n "$OTLP" ]]; then
  ARGS+=(--enable-trace --otlp-traces-endpoint "${OTLP#http://}")
  export SGLANG_CTXPROF_TRACE="${SGLANG_CTXPROF_TRACE:-slow}"
fi
ARGS+=("$@")
if [[ "${CTXPROF_PRINT_ARGS:-0}" == 1 ]]; then
  printf '%s\n' "${ARGS[@]}"
  exit 0
fi
exec "${PYTHON:-python}" -m sglang.launch_server "${ARGS[@]}"
