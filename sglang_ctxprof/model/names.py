"""The one vocabulary of sglang-ctxprof.

Every phase, span, attribute, metric, log-event and environment-variable name used anywhere in
the package lives here, so the HTTP view, the OTel view, the logs and the CLI can never disagree.
Naming follows the OpenTelemetry rules: lowercase, dot namespaces, snake_case leaves; `gen_ai.*`
semantic conventions are reused where the meaning matches, otherwise our own `ctxprof.*`.

This module imports nothing from the package, SGLang, torch or OTel.
"""

from __future__ import annotations

import enum

SCHEMA_VERSION = 1


class Phase(str, enum.Enum):
    """Time buckets of one decode step.

    Speculative decode: draft + verify_attn + verify_moe + verify_rest + draft_extend + overhead +
    unattributed == step, and ``verify`` is the sum of its three children.  Plain (non-speculative)
    decode: decode_attn + decode_moe + decode_rest + overhead == step, where ``decode`` (the target's
    one forward) is the sum of its three children.  Either way the leaf phases add up to the step.
    """

    DRAFT = "draft"
    VERIFY = "verify"
    VERIFY_ATTN = "verify_attn"
    VERIFY_MOE = "verify_moe"
    VERIFY_REST = "verify_rest"
    DRAFT_EXTEND = "draft_extend"
    OVERHEAD = "overhead"
    UNATTRIBUTED = "unattributed"
    STEP = "step"
    PREFILL = "prefill"
    DECODE = "decode"
    DECODE_ATTN = "decode_attn"
    DECODE_MOE = "decode_moe"
    DECODE_REST = "decode_rest"


# Phases whose sum is the step span when each target forward is split (display order); a forward
# whose split was not read counts whole in its parts' place (``records.leaf_phases``).
LEAF_PHASES: tuple[str, ...] = (
    Phase.DRAFT.value,
    Phase.VERIFY_ATTN.value,
    Phase.VERIFY_MOE.value,
    Phase.VERIFY_REST.value,
    Phase.DRAFT_EXTEND.value,
    Phase.OVERHEAD.value,
    Phase.UNATTRIBUTED.value,
    Phase.DECODE_ATTN.value,
    Phase.DECODE_MOE.value,
    Phase.DECODE_REST.value,
)
# Every phase that gets statistics in a decode bucket (display order).
REPORTED_PHASES: tuple[str, ...] = ((Phase.STEP.value, Phase.DRAFT.value, Phase.VERIFY.value) + LEAF_PHASES[1:7]
                                    + (Phase.DECODE.value,) + LEAF_PHASES[7:])
# The target forward of a step and its attention / MoE / rest split: a speculative step's verify,
# a plain decode step's decode (what the speculation ledger holds side by side).
FORWARD_SPLIT: dict[str, tuple[str, str, str]] = {
    Phase.VERIFY.value: (Phase.VERIFY_ATTN.value, Phase.VERIFY_MOE.value, Phase.VERIFY_REST.value),
    Phase.DECODE.value: (Phase.DECODE_ATTN.value, Phase.DECODE_MOE.value, Phase.DECODE_REST.value),
}
# The phases only a speculative step has: a plain arm (the ledger's plain decode) holds neither.
SPEC_PHASES: tuple[str, ...] = (Phase.DRAFT.value, Phase.VERIFY.value)
# Phases a custom worker may declare through ``sglang_ctxprof.phase(name)``.
DECLARABLE_PHASES: frozenset[str] = frozenset(
    {Phase.DRAFT.value, Phase.VERIFY.value, Phase.DRAFT_EXTEND.value}
)

# Record kinds.
KIND_DECODE = "decode"
KIND_PREFILL = "prefill"

# Timing modes reported in /ctx_profile.
TIMING_CPU = "cpu"
TIMING_CUDA_EVENTS = "cuda_events"
TIMING_CUDA_GRAPH_EVENTS = "cuda_graph_events"
TIMING_CUDA_GRAPH = "cuda_graph"  # verify ran in a CUDA graph; its attention/MoE split was not read
TIMING_CPU_THREAD = "cpu_thread"  # the CPU clock is the scheduler thread's own CPU time (CLOCK_THREAD)
TIMING_CPU_MODES = (TIMING_CPU, TIMING_CPU_THREAD)
# A profile's one ``timing`` is the most informative label among its records (later wins on ties).
TIMING_RANK = {TIMING_CPU: 0, TIMING_CPU_THREAD: 0, TIMING_CUDA_EVENTS: 1, TIMING_CUDA_GRAPH: 2,
               TIMING_CUDA_GRAPH_EVENTS: 3}
# The clock of a CPU server's step phases (config ``clock``, ``POST /ctx_profile/reset?clock=``): the wall
# clock (perf_counter), or the scheduler thread's CPU time (thread_time: what other processes preempt
# and GIL waits are left out; with OMP_NUM_THREADS=1 all of a CPU step's compute runs on that thread).
CLOCK_WALL = "wall"
CLOCK_THREAD = "thread"
CLOCKS = (CLOCK_WALL, CLOCK_THREAD)

# Execution modes of a step's verify forward (StepRecord.exec_mode; counted per bucket).
EXEC_GRAPH = "graph"
EXEC_EAGER = "eager"
EXEC_PIECEWISE = "piecewise"
EXEC_UNKNOWN = "unknown"  # the key counting records whose exec_mode is ""
EXEC_MODES: tuple[str, ...] = (EXEC_GRAPH, EXEC_EAGER, EXEC_PIECEWISE, EXEC_UNKNOWN)
EXEC_REASON_DISABLED = "CUDA graphs disabled"

# The robust per-phase context fit (views report it beside the least-squares one).
FIT_ROBUST_METHOD = "theil-sen"

# Algorithms whose worker seams we know: they get full phase records, and time outside the named
# phases is "overhead".  Any other algorithm reports it as "unattributed".
FULL_PHASE_ALGORITHMS: frozenset[str] = frozenset(
    {"EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NEXTN", "DFLASH", "DSPARK", "UNO", "NONE"}
)
ALGORITHM_NONE = "NONE"  # plain (non-speculative) decode
# Block drafters: the draft proposes a whole block of positions at once (block diffusion, or the
# target with a LoRA for UNO).  Their records carry the block size and the number of draft model
# forward passes (denoising / selection steps) of the step.
BLOCK_ALGORITHMS: frozenset[str] = frozenset({"DFLASH", "DSPARK", "UNO"})

# ---- environment variables (all parsed in model.config; docs/configuration.md lists them) -----
ENV_ENABLE = "SGLANG_CTX_PROFILE"
ENV_BUCKETS = "SGLANG_CTXPROF_BUCKETS"  # "pow2" | "fixed:<width>" | "edges:64,128,..."
ENV_MAX_CTX = "SGLANG_CTXPROF_MAX_CTX"
ENV_QUEUE_SIZE = "SGLANG_CTXPROF_QUEUE_SIZE"
ENV_REQUEST_RING = "SGLANG_CTXPROF_REQUEST_RING"
ENV_TRACE = "SGLANG_CTXPROF_TRACE"
ENV_READ_SHARE = "SGLANG_CTXPROF_READ_SHARE"  # the most of the HTTP process read builds may take
ENV_ALLOWED_HOSTS = "SGLANG_CTXPROF_ALLOWED_HOSTS"  # host names a browser's write may come through
ENV_CONTROL_TIMEOUT_S = "SGLANG_CTXPROF_CONTROL_TIMEOUT_S"  # how long a route waits for every scheduler
ENV_FAULT = "SGLANG_CTXPROF_FAULT"  # test-only fault injection: component name to break
ENV_CLI_DEBUG = "SGLANG_CTXPROF_DEBUG"  # 1: the CLI shows the traceback of a reply or file it cannot read
ENV_TRACE_SLOW_TOK_S = "SGLANG_CTXPROF_SLOW_TOK_S"
ENV_TRACE_SLOW_STEP_MS = "SGLANG_CTXPROF_SLOW_STEP_MS"
# Variables that no longer exist, with what replaced them (a set one is a clear start-up error).
ENV_REMOVED = {
    "SGLANG_CTXPROF_TRACE_MAX_OPEN": "the exporters read finished requests from the one request "
                                     "history, sized by SGLANG_CTXPROF_REQUEST_RING",
}
ENV_OTEL_QUEUE = "SGLANG_CTXPROF_OTEL_QUEUE"
ENV_LOG = "SGLANG_CTXPROF_LOG"  # off | text | json
ENV_LOG_FILE = "SGLANG_CTXPROF_LOG_FILE"  # path, "stderr" or "stdout"
ENV_LOG_LEVEL = "SGLANG_CTXPROF_LOG_LEVEL"  # debug | info | warning
ENV_LOG_SUMMARY_S = "SGLANG_CTXPROF_LOG_SUMMARY_S"
ENV_LOG_SLOW_STEP_PER_MIN = "SGLANG_CTXPROF_LOG_SLOW_STEPS_PER_MIN"
ENV_GRAPH_SAMPLE_EVERY = "SGLANG_CTXPROF_GRAPH_SAMPLE_EVERY"  # read the in-graph attn/MoE events every K-th step
ENV_GRAPH_FALLBACK = "SGLANG_CTXPROF_GRAPH_FALLBACK"  # off | eager (without Event(external=True))
ENV_GRAPH_TIMED_SHAPES = "SGLANG_CTXPROF_GRAPH_TIMED_SHAPES"  # all | none | every:N | sizes "1,8,32"
ENV_CLOCK = "SGLANG_CTXPROF_CLOCK"  # wall | thread: the CPU clock of the step phases (names.CLOCKS)
ENV_HBM_GBPS = "SGLANG_CTXPROF_HBM_GBPS"  # override of the device's memory bandwidth, GB/s
ENV_CAPTURE_DIR = "SGLANG_CTXPROF_CAPTURE_DIR"  # where deep captures are written
ENV_CAPTURE_INTERVAL_S = "SGLANG_CTXPROF_CAPTURE_INTERVAL_S"  # at most one capture per interval
ENV_CAPTURE_MAX_STEPS = "SGLANG_CTXPROF_CAPTURE_MAX_STEPS"  # the most steps one capture covers
ENV_CAPTURE_STEPS = "SGLANG_CTXPROF_CAPTURE_STEPS"  # steps of an automatic capture
ENV_CAPTURE_MAX_MB = "SGLANG_CTXPROF_CAPTURE_MAX_MB"  # byte cap on kept captures (oldest deleted first)
ENV_CAPTURE_SLOW_FACTOR = "SGLANG_CTXPROF_CAPTURE_SLOW_FACTOR"  # trigger: step > factor x prediction (0 off)
ENV_CAPTURE_SLOW_RUN = "SGLANG_CTXPROF_CAPTURE_SLOW_RUN"  # ... for this many decode steps in a row
ENV_CAPTURE_HOST_GAP_MS = "SGLANG_CTXPROF_CAPTURE_HOST_GAP_MS"  # trigger: host gap above this (0 off)
ENV_CAPTURE_SLOW_REQUEST = "SGLANG_CTXPROF_CAPTURE_SLOW_REQUEST"  # trigger: a running request the trace policy calls slow

# ---- the server flag -------------------------------------------------------------------------
CLI_FLAG = "--enable-ctx-profile"
CLI_DEST = "enable_ctx_profile"
SERVER_ARGS_ATTR = "_ctx_profile"

# ---- control channel: GetInternalStateReq rid marker, commands, reply key --------------------
CONTROL_RID_PREFIX = "__ctx_profile__"
CMD_SNAPSHOT = "snapshot"
CMD_RESET = "reset"
CMD_ENABLE = "enable"
CMD_DISABLE = "disable"
CMD_STATUS = "status"
CMD_REQUESTS = "requests"  # the slowest N requests (steps=True: with step rows), or one by rid with them
CMD_TRACE_POLICY = "trace_policy"  # read or change the tail-sampling policy
CMD_FAULT = "fault"  # test only: break one component (needs SGLANG_CTXPROF_FAULT=runtime at start)
CMD_RECENT = "recent"  # the last N step records of a rank (the trace export)
CMD_CAPTURE = "capture"  # request a deep capture (steps, rid) or read the captures
CONTROL_KEY = "ctx_profile"  # key inside GetInternalStateReqOutput.internal_state
PAYLOAD_SCHED_S = "sched_s"  # in each rank's answer: its scheduler thread's CPU seconds on the command

# ---- HTTP routes on SGLang's port, and the app path multi-tokenizer workers import -----------
ROUTE = "/ctx_profile"
ROUTE_STATUS = ROUTE + "/status"
ROUTE_REQUESTS = ROUTE + "/requests"  # ?slowest=N, or /{rid}
ROUTE_RESET = ROUTE + "/reset"
ROUTE_ENABLE = ROUTE + "/enable"
ROUTE_DISABLE = ROUTE + "/disable"
ROUTE_FAULT = ROUTE + "/fault"  # test only
ROUTE_TRACE_POLICY = ROUTE + "/trace_policy"
ROUTE_DIAGNOSIS = ROUTE + "/diagnosis"  # ?format=json|text, ?ctx=N (what-if), the verdict
ROUTE_UI = ROUTE + "/ui"  # the live page; its files under ROUTE_UI + "/{name}"
ROUTE_TRACE_JSON = ROUTE + "/trace.json"  # Chrome trace-event / Perfetto export, ?last=N or ?rid=
ROUTE_PLAIN = ROUTE + "/plain"  # POST (admin) a plain server's profile: the diagnosis's ledger reference
ROUTE_CAPTURE = ROUTE + "/capture"  # POST ?steps=N | ?rid=RID [&wait_s=S] (admin); GET /{id}[?format=timeline]
ROUTE_CAPTURE_CANCEL = ROUTE_CAPTURE + "/cancel"  # POST [?id=ID] (admin): the pending or running capture
CAPTURE_WAIT_S = 60.0  # a capture not started this long after it was asked for fails (``wait_s``) ...
CAPTURE_MAX_WAIT_S = 3600.0  # ... which is at most this
FORMAT_STATE = "state"  # GET /ctx_profile?format=state: the merged mergeable state (fleet view)
# Prompt tokens found in the prefix cache: SGLang's name (``Req.cached_tokens``, ``meta_info``) and
# ours wherever we show it (a prefill bucket, a sweep point, ``StepRecord.cached_tokens``).
CACHED_TOKENS = "cached_tokens"
MAX_TRACE_STEPS = 2048  # step records each rank keeps for the trace export; the most ?last=N answers
DEFAULT_TRACE_STEPS = 256
# request rows (a step's batch) one trace read writes at most per rank, the newest steps first: the
# scheduler thread writes them (~1 us a row), so a read of 2048 steps at batch 256 stays ~40 ms
MAX_TRACE_ROWS = 32768
# A request id the routes accept (``rids.valid_rid``): SGLang takes any string as a rid, so any
# text of 1-RID_MAX characters but a control, format, line-separator or surrogate character (a rid
# reaches logs and terminals).  Only a plain one goes in a URL path as it is (RID_PLAIN, and not "."
# nor holding ".."); clients ask ``/requests?rid=`` for any other.
RID_MAX = 256
RID_PLAIN = rf"^[A-Za-z0-9_.:\-]{{1,{RID_MAX}}}\Z"
RID_MALFORMED = f"malformed rid: use 1-{RID_MAX} characters, none a control, format or line-separator character"
CAPTURE_ID_PATTERN = RID_PLAIN  # a capture id names a file and goes into URL paths
MAX_SLOWEST = 1000  # the most requests one ?slowest=N answers
# step rows one ?slowest=N&steps=1 answer ships per rank, the slowest requests' first (they are built
# on the scheduler thread: ~5-10 us a row); a request past it comes with ``step_rows_left_out``
MAX_READ_STEP_ROWS = 4096  # as many as one request keeps (max_steps): no more than reading it by rid
MAX_WHATIF_CTX = 10**9  # the largest context the diagnosis's what-if (?ctx=N) answers for
ENV_SGLANG_APP_PATH = "SGLANG_HTTP_SERVER_APP_PATH"
HTTP_APP_PATH = "sglang_ctxprof.http_app:app"

# ---- deep capture (collect/capture.py): triggers, states, the ranges in the profiler's trace ----
TRIGGER_MANUAL = "manual"  # POST /ctx_profile/capture?steps=N
TRIGGER_RID = "rid"  # POST /ctx_profile/capture?rid=RID: that request's next steps
TRIGGER_SLOW_STEP = "slow_step"  # a decode step slower than its context model predicts
TRIGGER_HOST_GAP = "host_gap"  # a host gap between steps above the threshold
TRIGGER_SLOW_REQUEST = "slow_request"  # a running request the trace policy judges slow: its next steps
TRIGGERS: tuple[str, ...] = (TRIGGER_MANUAL, TRIGGER_RID, TRIGGER_SLOW_STEP, TRIGGER_HOST_GAP, TRIGGER_SLOW_REQUEST)
CAPTURE_PENDING = "pending"
CAPTURE_RUNNING = "running"
CAPTURE_EXPORTING = "exporting"
CAPTURE_DONE = "done"
CAPTURE_FAILED = "failed"
CAPTURE_DELETED = "deleted"  # removed by the byte cap (oldest first)
RANGE_PREFIX = "ctxprof."  # record_function ranges: "ctxprof.verify_attn step=12 ctx=345"
RANGE_STEP = "ctxprof.step"
RANGE_CLOCK_SYNC = "ctxprof.clock_sync"  # opened at a known wall time: aligns the two clocks
# The request span's links to the deep captures that covered its steps (lists, one entry per capture;
# ``steps``: the request's step ids the captures cover)
ATTR_CAPTURE_ID = "sglang.ctxprof.capture.id"
ATTR_CAPTURE_TRIGGER = "sglang.ctxprof.capture.trigger"
ATTR_CAPTURE_URI = "sglang.ctxprof.capture.uri"  # where to fetch it: GET <server>/ctx_profile/capture/<id>
ATTR_CAPTURE_PATH = "sglang.ctxprof.capture.path"  # the trace file on the server ("" until written)
ATTR_CAPTURE_STEPS = "sglang.ctxprof.capture.steps"

# ---- instrumentor: the marker every wrapper carries ------------------------------------------
WRAPPER_MARK = "__ctxprof_wrapper__"

# ---- OTel spans and attributes ---------------------------------------------------------------
TRACER_NAME = "sglang_ctxprof"
SPAN_REQUEST = "ctxprof.request"
SPAN_STEP = "ctxprof.step"
SPAN_PREFILL = "ctxprof.prefill"
SPAN_PHASE_PREFIX = "ctxprof."  # phase spans are "ctxprof.draft", "ctxprof.verify", "ctxprof.verify_attn", ...
ATTR_RID = "gen_ai.response.id"  # the request id SGLang returns as the response id
ATTR_PROMPT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ATTR_CTX_LEN = "ctxprof.ctx_len"
ATTR_CTX_BUCKET = "ctxprof.ctx_bucket"
ATTR_PHASE = "ctxprof.phase"
ATTR_STEP_ID = "ctxprof.step_id"
ATTR_BATCH_SIZE = "ctxprof.batch_size"
ATTR_DRAFT_TOKENS = "ctxprof.draft_tokens"
ATTR_ACCEPTED = "ctxprof.accepted_tokens"
ATTR_ACCEPT_MEAN = "ctxprof.accepted_per_step"
ATTR_DECODE_TOK_S = "ctxprof.decode_tok_s"
ATTR_STEP_MS = "ctxprof.step_ms"
ATTR_STEPS = "ctxprof.steps"
ATTR_STEPS_TRUNCATED = "ctxprof.steps_truncated"
ATTR_COMMITTED = "ctxprof.committed_tokens"
ATTR_SLOW_REASON = "ctxprof.slow_reason"
ATTR_LAYOUT = "ctxprof.phase_layout"  # one of the LAYOUT_* values (see views/otel.py)
LAYOUT_SEQUENTIAL = "sequential"  # phase spans laid back to back inside each step span
LAYOUT_ATTRIBUTES = "attributes"  # no phase spans: each phase's ms an ATTR_PHASE_MS_PREFIX attribute of its step
ATTR_PHASE_MS_PREFIX = "ctxprof.phase_ms."  # + phase name: its ms in the step (LAYOUT_ATTRIBUTES)
ATTR_DECODE_MS = "ctxprof.decode_ms"
ATTR_FINISHED = "ctxprof.finished"
ATTR_ABORTED = "ctxprof.aborted"  # an ABORT_KINDS value: SGLang aborted the request while it waited
ATTR_PARTIAL = "ctxprof.partial"  # the history missed some of its steps: its totals are a lower bound

# ---- Prometheus metrics ----------------------------------------------------------------------
METRIC_PHASE_SECONDS = "sglang_ctxprof_phase_seconds"
METRIC_ACCEPTED = "sglang_ctxprof_accepted_tokens"
METRIC_STEPS = "sglang_ctxprof_steps"
METRIC_REQUEST_STEPS = "sglang_ctxprof_request_steps"  # request-steps (steps x batch size)
METRIC_DRAFT_TOKENS = "sglang_ctxprof_draft_tokens"  # draft budget x batch size
METRIC_POSITION_ACCEPTED = "sglang_ctxprof_position_accepted"  # request-steps whose draft position i was accepted
METRIC_POSITION_OBSERVED = "sglang_ctxprof_position_observed"  # request-steps whose draft budget reached position i
METRIC_CACHED_TOKENS = "sglang_ctxprof_prefill_cached_tokens"  # prompt tokens found in the prefix cache
METRIC_DROPPED = "sglang_ctxprof_dropped_records"  # records the hot path's queue dropped
METRIC_SINK_DROPPED = "sglang_ctxprof_sink_dropped_records"  # records the sinks missed (a stalled sink)
METRIC_DEGRADED = "sglang_ctxprof_degraded"  # 1 while a component is disabled after a failure
METRIC_INVARIANT_VIOLATIONS = "sglang_ctxprof_invariant_violations"  # the self-audit's, label ``invariant``
# The live self-audit's invariants (aggregate/audit.py), in the order /ctx_profile/status lists them.
AUDIT_INVARIANTS: tuple[str, ...] = ("leaf_sum", "verify_ct", "completion_tokens", "accepted_bound",
                                     "hook_once", "accept_metric")
LABEL_MODEL = "model_name"  # the label SGLang's own sglang:* metrics use for the served model
LABEL_PHASE = "phase"  # a Phase value
LABEL_CTX_BUCKET = "ctx_bucket"  # a configured bucket's label (Bucketing), never a raw length
LABEL_POSITION = "position"  # a draft position, 1..MAX_POSITION_LABEL
LABEL_COMPONENT = "component"  # a fault-guard component (model.guard.COMPONENTS)
LABEL_INVARIANT = "invariant"  # an AUDIT_INVARIANTS name
RESOURCE_SERVICE_NAME = "service.name"  # OTel resource attribute, when OTEL_SERVICE_NAME is unset
DEFAULT_SERVICE_NAME = "sglang"
METRIC_REQUESTS_ABORTED = "sglang_ctxprof_requests_aborted"  # label ``kind`` (ABORT_KINDS)
LABEL_ABORT_KIND = "kind"
# How a request SGLang aborted while it waited had been waiting (records.RequestEnd.kind): queued
# (before its first step, or between prefill chunks), or retracted and waiting to be prefilled again.
ABORT_QUEUED = "queued"
ABORT_RETRACTED = "retracted"
ABORT_KINDS: tuple[str, ...] = (ABORT_QUEUED, ABORT_RETRACTED)
MAX_POSITION_LABEL = 32  # draft positions above this are not labelled (bounded cardinality)

# ---- log events ------------------------------------------------------------------------------
LOGGER_NAME = "sglang_ctxprof.events"
EVENT_SLOW_STEP = "slow_step"
EVENT_SLOW_REQUEST = "slow_request"
EVENT_SUMMARY = "ctx_profile_summary"
EVENT_REQUEST_ABORTED = "request_aborted"  # one per request SGLang aborted while it waited
