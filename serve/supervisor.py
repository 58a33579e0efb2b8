"""The processes of one service, kept alive: workers, the router, and the front at the public port.

``Service.start`` launches the workers, waits for their ``/health``, launches sglang-router on an
internal port, then the front (front.py, a thread of this process) at ``cfg.host:cfg.port``: the
service's one address. A watcher thread then polls every child (``Popen.poll``, each tick) and
probes it (worker ``/health``, router ``/liveness``) every ``health_interval_s``. A child that
exits, or fails ``health_failures`` probes in a row (hung: it is killed), is *dead*, and:

- it is restarted after a backoff (``backoff_s``, doubling per restart, at most ``backoff_max_s``)
  while it has died at most ``router_restarts`` / ``worker_restarts`` times in ``window_s``;
  the restarted child gets the same command line, so the same ports and config;
- past that limit (or with a limit of 0) the service has *failed*: ``/health`` at the front
  answers 503 naming the child, how it died and its log's tail, and ``run_forever`` stops every
  process and returns 1 with the same message (``glmlab serve`` exits non-zero).

Requests in flight on a dead child fail at once (their connections break; the front turns that
into a 502 or an SSE error event naming the child). Every child gets a parent-death signal, so a
supervisor killed with SIGKILL leaves nothing behind. What each fault looks like to a client, and
in how long, is in docs/serving.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from glmlab.serve.config import InstanceSpec, Role, ServeConfig, WorkerConfig
from glmlab.serve.limits import HttpLimits
from glmlab.serve.router import (
    free_ports,
    http_get,
    router_argv,
    router_ready,
    router_sees,
    wait_until,
)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # its own process group: a terminal's Ctrl-C reaches the supervisor alone, which then stops
    # the children in order instead of watching them all die at once and restarting them
    os.setpgrp()


@dataclass(frozen=True)
class Supervision:
    """What the supervisor does with a child that dies or hangs (flags ``--supervise-*``)."""

    router_restarts: int = 5  # deaths per window that are restarted; 0: a dead router fails all
    worker_restarts: int = 3  # the same, per worker (a restart reloads the checkpoint)
    window_s: float = 600.0
    backoff_s: float = 0.5  # before the first restart in the window; doubles per restart
    backoff_max_s: float = 30.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 5.0
    health_failures: int = 3  # failed probes in a row: the child is hung, killed, and dead

    def __post_init__(self) -> None:
        if min(self.router_restarts, self.worker_restarts) < 0 or self.health_failures < 1:
            raise ValueError("restart limits must be >= 0 and health_failures >= 1")

    def limit(self, child: Child) -> int:
        return self.router_restarts if child.role == "router" else self.worker_restarts


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Child:
    """One supervised process; ``proc`` is replaced on each restart."""

    name: str
    role: str  # "router" or the worker's role
    argv: list[str]
    env: dict[str, str]
    url: str
    log: Path
    health_path: str
    proc: subprocess.Popen | None = None
    state: str = "starting"  # starting | up | backoff | failed
    deaths: list[float] = field(default_factory=list)  # within the window
    restarts: int = 0
    last_death: str = ""  # "decode0 (pid 12) was killed by signal 9 (SIGKILL)"
    died_at: float = 0.0
    next_start: float = 0.0
    started_at: float = 0.0
    probe: Future | None = None
    probed_at: float = 0.0
    failed_probes: int = 0

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def spawn(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env},
                                         preexec_fn=_die_with_parent)
        self.started_at, self.probe, self.failed_probes = time.monotonic(), None, 0

    def status(self) -> dict:
        return {"name": self.name, "role": self.role, "url": self.url, "state": self.state,
                "pid": self.proc.pid if self.proc else None, "restarts": self.restarts,
                "last_death": self.last_death or None}


class Service:
    def __init__(self, cfg: ServeConfig, model_dir: Path, served_model_name: str,
                 engine_options: dict[Role, dict] | None = None, quiet: bool = False,
                 supervision: Supervision | None = None, limits: HttpLimits | None = None,
                 tick_s: float = 0.05):
        self.cfg, self.model_dir, self.served_model_name = cfg, Path(model_dir), served_model_name
        self.engine_options = engine_options or {}
        self.quiet, self.tick_s = quiet, tick_s
        self.supervision, self.limits = supervision or Supervision(), limits or HttpLimits()
        self.log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="glmlab-serve-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        self.failure: str | None = None  # set once, when a child is past its restart limit
        self.front = None
        self.router_url = ""
        self._lock = threading.RLock()
        self._failed, self._stopping = threading.Event(), threading.Event()
        self._watcher: threading.Thread | None = None
        self._probes = ThreadPoolExecutor(max_workers=8, thread_name_prefix="glmlab-probe")

    @property
    def url(self) -> str:
        """The service's one address (the front); without a router, nothing listens there."""
        return f"http://{self.cfg.host}:{self.cfg.port}"

    def worker(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def workers(self) -> list[Child]:
        return [c for c in self.children if c.role != "router"]

    # start -------------------------------------------------------------------------------
    def start(self) -> Service:
        try:
            for spec in self.cfg.launched_here():
                self._add(self._worker_child(spec))
            for child in list(self.children):
                self._say(f"waiting for {child.name} at {child.url} ...")
                wait_until(lambda c=child: http_get(f"{c.url}/health")[0] == 200,
                           self.cfg.startup_timeout_s, child.name, self.problem)
            if self.cfg.launch_router:
                (port,) = free_ports(1, self.cfg.host)
                self.router_url = f"http://{self.cfg.host}:{port}"
                self._add(Child("router", "router", router_argv(
                    self.cfg, self.cfg.layout(), port, self.supervision.health_interval_s),
                    {}, self.router_url, self.log_dir / "router.log", "/liveness"))
                wait_until(lambda: router_ready(self.router_url), self.cfg.startup_timeout_s,
                           "router", self.problem)
                from glmlab.serve.front import Front

                self.front = Front(self, self.cfg.host, self.cfg.port, self.router_url,
                                   self.limits, self.cfg.request_timeout_s)
                self.front.start()
        except BaseException:
            self.stop()
            raise
        return self.supervise()

    def supervise(self) -> Service:
        """Watch the children (all up now) from a thread of this process until ``stop``."""
        for c in self.children:
            c.state = "up"
        self._watcher = threading.Thread(target=self._watch, name="glmlab-supervisor",
                                         daemon=True)
        self._watcher.start()
        return self

    def _worker_child(self, spec: InstanceSpec) -> Child:
        wc = WorkerConfig(spec=spec, model_dir=str(self.model_dir),
                          served_model_name=self.served_model_name,
                          torch_threads=self.cfg.torch_threads,
                          reasoning_parser=self.cfg.reasoning_parser,
                          tool_call_parser=self.cfg.tool_call_parser,
                          engine=self.engine_options.get(spec.role, {}),
                          transfer=self.cfg.transfer, limits=self.limits)
        argv = [sys.executable, "-m", "glmlab.serve.server", "--config", wc.to_json()]
        env = self.cfg.transfer.ucx_env() if spec.role is not Role.MIXED else {}
        return Child(spec.name, spec.role.value, argv, env, spec.url,
                     self.log_dir / f"{spec.name}.log", "/health")

    def _add(self, child: Child) -> None:
        child.spawn()
        self.children.append(child)

    # watch -------------------------------------------------------------------------------
    def problem(self) -> str | None:
        """A message naming the first child whose process has exited, else None."""
        for c in self.children:
            code = c.proc.poll() if c.proc else None
            if code is not None:
                return (f"{c.name} (pid {c.proc.pid}) {describe_exit(code)}; last lines of "
                        f"{c.log}:\n{c.tail()}")
        return None

    def _watch(self) -> None:
        while not self._stopping.wait(self.tick_s):
            self.refresh()

    def refresh(self) -> None:
        """One round of supervision; also called by the front when an upstream breaks, so a
        client's error can name a child that died a moment ago."""
        with self._lock:
            if self._stopping.is_set():
                return
            now = time.monotonic()
            for c in self.children:
                self._check(c, now)

    def _check(self, c: Child, now: float) -> None:
        sv = self.supervision
        if c.state == "backoff" and now >= c.next_start:
            c.spawn()
            c.state = "starting"
            self._say(f"glmlab serve: restarting {c.name} (pid {c.proc.pid})")
            return
        if c.state not in ("up", "starting"):
            return
        code = c.proc.poll()
        if code is not None:
            return self._died(c, f"{c.name} (pid {c.proc.pid}) {describe_exit(code)}", now)
        if c.probe is not None and c.probe.done():
            ok, c.probe = c.probe.result(), None
            c.failed_probes = 0 if ok else c.failed_probes + 1
            if ok and c.state == "starting":
                c.state = "up"
                self._say(f"glmlab serve: {c.name} is back (pid {c.proc.pid}, "
                          f"{now - c.started_at:.1f} s after its restart)")
        if c.state == "up" and c.failed_probes >= sv.health_failures:
            c.proc.kill()
            c.proc.wait()
            return self._died(c, f"{c.name} (pid {c.proc.pid}) stopped answering "
                                 f"{c.health_path} ({c.failed_probes} probes of "
                                 f"{sv.health_timeout_s:g} s); killed it", now)
        if c.state == "starting" and now - c.started_at > self.cfg.startup_timeout_s:
            c.proc.kill()
            c.proc.wait()
            return self._died(c, f"{c.name} (pid {c.proc.pid}) was not healthy "
                                 f"{self.cfg.startup_timeout_s:g} s after its restart", now)
        interval = self.tick_s * 4 if c.state == "starting" else sv.health_interval_s
        if c.probe is None and now - c.probed_at >= interval:
            c.probed_at = now
            c.probe = self._probes.submit(self._healthy, c)

    def _healthy(self, c: Child) -> bool:
        if http_get(c.url + c.health_path, self.supervision.health_timeout_s)[0] != 200:
            return False
        if c.state == "starting" and c.role != "router" and self.router_url:
            # back only once the router routes to it again (its own health checks, every
            # health_interval_s); a router that is down itself finds it when it starts
            return router_sees(self.router_url, c.url) is not False
        return True

    def _died(self, c: Child, how: str, now: float) -> None:
        sv = self.supervision
        c.deaths = [t for t in c.deaths if now - t < sv.window_s] + [now]
        c.last_death, c.died_at, c.probe = how, now, None
        limit = sv.limit(c)
        if len(c.deaths) > limit:
            c.state = "failed"
            self.failure = (f"{how}; restart limit reached ({limit} restarts in "
                            f"{sv.window_s:g} s); last lines of {c.log}:\n{c.tail()}")
            self._say(f"glmlab serve: {how}; not restarted (limit {limit} in "
                      f"{sv.window_s:g} s)")
            self._failed.set()
            return
        delay = min(sv.backoff_max_s, sv.backoff_s * 2 ** (len(c.deaths) - 1))
        c.state, c.next_start = "backoff", now + delay
        c.restarts += 1
        self._say(f"glmlab serve: {how}; restarting it in {delay:g} s (restart "
                  f"{len(c.deaths)} of {limit} in {sv.window_s:g} s)")

    # what the front shows -----------------------------------------------------------------
    def health(self, refresh: bool = False) -> tuple[bool, str]:
        """(healthy, why not): every child up, and the service has not failed. ``refresh``
        polls the children first (the front, when an upstream connection breaks)."""
        if refresh:
            self.refresh()
        if self.failure:
            return False, "the service failed: " + self.failure
        with self._lock:
            down = [c for c in self.children if c.state != "up"]
            if not down:
                return True, "ok"
            return False, "; ".join(self._down_text(c) for c in down)

    def recent_deaths(self, within_s: float = 10.0) -> str:
        """Children that died in the last ``within_s`` and are back ('' when none)."""
        now = time.monotonic()
        with self._lock:
            return "; ".join(f"{c.last_death} {now - c.died_at:.1f} s ago (restarted)"
                             for c in self.children
                             if c.last_death and now - c.died_at < within_s)

    def _down_text(self, c: Child) -> str:
        if c.state == "failed":
            return f"{c.last_death}; not restarted (restart limit reached)"
        if c.state == "backoff":
            return (f"{c.last_death}; restarting it in "
                    f"{max(0.0, c.next_start - time.monotonic()):.1f} s")
        if c.last_death:
            return f"{c.last_death}; restarting it (pid {c.proc.pid}, not healthy yet)"
        return f"{c.name} is starting"

    def components(self) -> list[dict]:
        with self._lock:
            return [c.status() for c in self.children]

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until every child is up again (tests, after a fault); raises on failure."""
        wait_until(lambda: self.health()[0], timeout_s, "service",
                   lambda: self.failure)

    # run / stop --------------------------------------------------------------------------
    def run_forever(self, poll_s: float = 0.5) -> int:
        """Block until Ctrl-C / SIGTERM (exit 0) or a failed child (exit 1); always stops all."""
        stop = {"signal": None}

        def on_signal(signum, _frame):
            stop["signal"] = signum
            self._failed.set()  # wakes the wait below

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while stop["signal"] is None and not self.failure:
                self._failed.wait(poll_s)
            if self.failure:
                print(f"glmlab serve: {self.failure}\nglmlab serve: stopping the service",
                      file=sys.stderr, flush=True)
                return 1
            self._say("glmlab serve: stopping (signal received)")
            return 0
        finally:
            self.stop()
            for s, h in old.items():
                signal.signal(s, h)

    def stop(self, grace_s: float = 10.0) -> None:
        """Front first (no new requests), then the router, then workers; SIGTERM, then SIGKILL
        after ``grace_s``. Nothing is restarted once this begins."""
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(5)
        if self.front is not None:
            self.front.stop()
            self.front = None
        with self._lock:
            live = [c for c in reversed(self.children) if c.proc is not None]
            for c in live:
                if c.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        c.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for c in live:
                try:
                    c.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait()
        self._probes.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Service:
        return self.start() if not self.children else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)
