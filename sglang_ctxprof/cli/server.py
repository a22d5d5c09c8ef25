"""``ServerProcess``: start a real SGLang server, wait until it is ready, stop it without leftovers.

The server runs in its own session (process group); on exit we send SIGTERM to the launcher, wait,
then SIGKILL the whole group, so no scheduler or detokenizer survives (also when the launcher
has exited already: the group outlives its leader).  Readiness means ``/v1/models`` answers 200
and lists the model; a process that exits early, or a timeout, raises
:class:`ServerError` with the tail of the server log.

Once ready, a server started with ``--skip-server-warmup`` (as ``cpu_args`` does) is sent SGLang's
own ``POST /freeze_gc``.  SGLang posts it itself after its warm-up so that its start-up heap leaves
the garbage collector's generations, but with ``--skip-server-warmup`` it posts at once from the
warm-up thread, with no retry, racing uvicorn's bind: on this machine it lost about two starts in
three ("post-warmup freeze_gc failed" in the log).  Then every full collection of the HTTP process,
the scheduler and the detokenizer walks that heap: 0.5-1 s pauses, one streamed chunk gap each,
where a frozen server pauses 2-8 ms (``bench/reader_stall.py --gc-probe``).  ``gc_frozen`` says
whether the freeze was answered.

A server's port is chosen by :func:`free_port` below the kernel's ephemeral range: the server
binds it only after loading its model, and meanwhile any outgoing connection may take a port from
that range (the demo's spec server once failed to start with "address already in use").

``cpu_args()`` is the measured CPU recipe (see launch/cpu-demo.sh).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import IO, Mapping, Sequence


class ServerError(RuntimeError):
    pass


CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}


def cpu_args(model: str, *, algorithm: str | None = None, draft: str | None = None,
             num_steps: int = 3, topk: int = 1, num_draft_tokens: int = 4) -> list[str]:
    """Launch arguments for SGLang on this CPU: the recipe from the reference REPORT, section 2."""
    args = ["--model-path", model, "--device", "cpu", "--disable-cuda-graph",
            "--max-total-tokens", "16384", "--mem-fraction-static", "0.3", "--skip-server-warmup"]
    if algorithm:
        args += ["--attention-backend", "intel_amx", "--speculative-algorithm", algorithm]
        if algorithm.upper() == "NGRAM":
            args += ["--speculative-num-draft-tokens", str(num_draft_tokens)]
        else:
            args += ["--speculative-num-steps", str(num_steps), "--speculative-eagle-topk", str(topk),
                     "--speculative-num-draft-tokens", str(num_draft_tokens)]
        if draft:
            args += ["--speculative-draft-model-path", draft]
    else:
        args += ["--attention-backend", "torch_native"]
    return args


def _arg(cmd: Sequence[str], flag: str) -> str | None:
    """The value after ``flag`` in ``cmd`` (None when absent)."""
    for i, a in enumerate(cmd[:-1]):
        if a == flag:
            return cmd[i + 1]
    return None


def admin_key(given: str | None, server_args: Sequence[str]) -> str | None:
    """The admin key a launched server wants: the one given (``--admin-key``), else its own
    ``--admin-api-key``."""
    return given or _arg(server_args, "--admin-api-key")


PORT_LOW, PORT_HIGH = 10000, 21999  # free_port's range: below SGLang's own (22000-29999) and the kernel's ephemeral one
_given: set[int] = set()  # ports free_port handed out in this process


def _ephemeral_low() -> int:
    """Where the kernel's ephemeral range begins (``bind(0)`` and ``connect()`` draw from it up)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def free_port() -> int:
    """A free TCP port for a server that binds it only later, after loading its model.  Picked at
    random below the kernel's ephemeral range, which every outgoing connection meanwhile draws
    from (readiness polls, SGLang's own connections: a port from ``bind(0)`` was once taken that
    way before the server bound it), and below the range where SGLang picks its own later-bound
    ports (``get_free_port_below_ephemeral``); never the same port twice in a process (servers
    start side by side).  Where there is no room below the ephemeral range, the kernel's pick."""
    high = min(PORT_HIGH, _ephemeral_low() - 1)
    if high >= PORT_LOW:
        for port in random.sample(range(PORT_LOW, high + 1), min(64, high - PORT_LOW + 1)):
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port


class ServerProcess:
    def __init__(self, args: Sequence[str], *, port: int | None = None, host: str = "127.0.0.1",
                 env: Mapping[str, str] | None = None, log_path: str | None = None,
                 timeout: float = 600.0, python: str | None = None, freeze_gc: bool = True) -> None:
        self.port = port or free_port()
        self.host = host
        self.url = f"http://{host}:{self.port}"
        self.cmd = [python or sys.executable, "-m", "sglang.launch_server", *args,
                    "--host", host, "--port", str(self.port)]
        self.env = {**os.environ, **CPU_ENV, **(env or {})}
        self.log_path = log_path
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.freeze_after_start = freeze_gc  # False: leave the freeze to SGLang's race (benches compare)
        self.gc_frozen: bool | None = None  # after ready(): whether SGLang's freeze_gc was answered
        self.startup_s: float | None = None
        self._t0 = 0.0
        self._log: "IO[str] | int | None" = None

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.spawn()
        self.ready()

    def spawn(self) -> None:
        """Start the process without waiting for it (``ready()`` waits): two servers start side by side."""
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self._t0 = time.time()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)

    def ready(self) -> None:
        """Wait until the spawned server answers; stop it and raise ``ServerError`` if it cannot."""
        try:
            self.wait_ready(self._t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.time() - self._t0
        if self.freeze_after_start and "--skip-server-warmup" in self.cmd:
            self.gc_frozen = self.freeze_gc()

    def freeze_gc(self) -> bool:
        """SGLang's post-warm-up ``POST /freeze_gc`` (its processes freeze their heaps), with the
        admin (else API) key of the command line; True when answered 200."""
        key = _arg(self.cmd, "--admin-api-key") or _arg(self.cmd, "--api-key")
        req = urllib.request.Request(self.url + "/freeze_gc", data=b"", method="POST",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, t0: float) -> None:
        proc = self.proc
        if proc is None:
            raise ServerError("wait_ready before start()")
        key = _arg(self.cmd, "--api-key")  # with one, SGLang guards every route, this probe's too
        probe = urllib.request.Request(self.url + "/v1/models",
                                       headers={"Authorization": f"Bearer {key}"} if key else {})
        while time.time() - t0 < self.timeout:
            if proc.poll() is not None:
                raise ServerError(f"SGLang exited with code {proc.returncode} during start-up"
                                  f"{self._tail()}")
            try:
                with urllib.request.urlopen(probe, timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()).get("data"):
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.5)
        raise ServerError(f"SGLang did not become ready within {self.timeout:.0f}s{self._tail()}")

    def _tail(self, n: int = 30) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            lines = f.readlines()[-n:]
        return f"; last lines of {self.log_path}:\n" + "".join(lines)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid  # its own session: the group's id is the launcher's pid, even once it has exited
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:  # nothing of the group is left
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._log is not None and not isinstance(self._log, int):  # an int is DEVNULL: nothing to close
            self._log.close()
        self.proc = None
