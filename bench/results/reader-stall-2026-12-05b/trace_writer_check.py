import sys, json, time
sys.path.insert(0,'.'); sys.path.insert(0,'bench')
from profile_build import fill
from sglang_ctxprof.views.trace_events import steps_trace
from sglang_ctxprof.views.trace_json import TraceWriter
from sglang_ctxprof.views.http_guard import json_response
agg = fill(3000)
rows = [json.dumps(r, separators=(",",":")) for r in agg.recent_steps(2048)]
w = TraceWriter()
for k in range(3):
    t0=time.perf_counter(); txt = w.render([({"tp":0,"dp":0,"pp":0}, rows)], 2048); t1=time.perf_counter()
    ref = json_response(steps_trace([({"tp":0,"dp":0,"pp":0}, [json.loads(r) for r in rows])], 2048)).body.decode()
    t2=time.perf_counter()
    print(txt == ref, len(txt), f"fast {1e3*(t1-t0):.1f} ms ref {1e3*(t2-t1):.1f} ms", w.written)
