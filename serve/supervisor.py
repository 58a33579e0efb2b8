"""The processes of one service: workers first, then the router; watched until one dies or Ctrl-C.

Every child is started with a parent-death signal, so even a supervisor killed with SIGKILL leaves
no worker or router behind; a clean stop sends SIGTERM, waits, then SIGKILL. A child that exits
on its own stops the whole service with a message naming it, its exit code and its log's tail.

Used by ``glmlab serve`` (``run_forever``), by tests and by notebooks (``with Service(...) as s``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from glmlab.serve.config import InstanceSpec, Role, ServeConfig, WorkerConfig
from glmlab.serve.router import http_get, router_argv, router_ready, wait_until

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path
    url: str

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class ServiceError(RuntimeError):
    pass


class Service:
    def __init__(self, cfg: ServeConfig, model_dir: Path, served_model_name: str,
                 engine_options: dict[Role, dict] | None = None, quiet: bool = False):
        self.cfg, self.model_dir, self.served_model_name = cfg, Path(model_dir), served_model_name
        self.engine_options = engine_options or {}
        self.quiet = quiet
        self.log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="glmlab-serve-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.port}"

    def worker(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    # start -------------------------------------------------------------------------------
    def start(self) -> Service:
        try:
            for spec in self.cfg.launched_here():
                self._spawn_worker(spec)
            for child in list(self.children):
                self._say(f"waiting for {child.name} at {child.url} ...")
                wait_until(lambda c=child: http_get(f"{c.url}/health")[0] == 200,
                           self.cfg.startup_timeout_s, child.name, self.problem)
            if self.cfg.launch_router:
                self._spawn("router", router_argv(self.cfg, self.cfg.layout()), self.url, {})
                wait_until(lambda: router_ready(self.url), self.cfg.startup_timeout_s,
                           "router", self.problem)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_worker(self, spec: InstanceSpec) -> None:
        wc = WorkerConfig(spec=spec, model_dir=str(self.model_dir),
                          served_model_name=self.served_model_name,
                          torch_threads=self.cfg.torch_threads,
                          engine=self.engine_options.get(spec.role, {}),
                          transfer=self.cfg.transfer)
        argv = [sys.executable, "-m", "glmlab.serve.server", "--config", wc.to_json()]
        env = self.cfg.transfer.ucx_env() if spec.role is not Role.MIXED else {}
        self._spawn(spec.name, argv, spec.url, env)

    def _spawn(self, name: str, argv: list[str], url: str, env: dict[str, str]) -> None:
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                    preexec_fn=_die_with_parent)
        self.children.append(Child(name, proc, log, url))

    # watch -------------------------------------------------------------------------------
    def problem(self) -> str | None:
        """A message naming the first child that exited, else None."""
        for c in self.children:
            code = c.proc.poll()
            if code is not None:
                return (f"{c.name} (pid {c.proc.pid}) exited with code {code}; "
                        f"last lines of {c.log}:\n{c.tail()}")
        return None

    def run_forever(self, poll_s: float = 0.5) -> int:
        """Block until Ctrl-C / SIGTERM (exit 0) or a dead child (exit 1); always stops all."""
        stop = {"signal": None}

        def on_signal(signum, _frame):
            stop["signal"] = signum

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while stop["signal"] is None:
                problem = self.problem()
                if problem:
                    print(f"glmlab serve: {problem}\nglmlab serve: stopping the service",
                          file=sys.stderr, flush=True)
                    return 1
                time.sleep(poll_s)
            self._say("glmlab serve: stopping (signal received)")
            return 0
        finally:
            self.stop()
            for s, h in old.items():
                signal.signal(s, h)

    # stop --------------------------------------------------------------------------------
    def stop(self, grace_s: float = 10.0) -> None:
        """Router first (no new requests), then workers; SIGTERM, then SIGKILL after ``grace_s``."""
        for c in reversed(self.children):
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in reversed(self.children):
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        self.children = [c for c in self.children if c.proc.returncode is None]

    def __enter__(self) -> Service:
        return self.start() if not self.children else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)
