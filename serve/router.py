"""sglang-router (pinned 0.3.2) behind the service's front: its command line, and waiting for it.

PD mode: ``--pd-disaggregation --prefill URL BOOTSTRAP_PORT ... --decode URL ...``; mixed mode:
``--worker-urls URL ...``. Everything the router binds is pinned to the configured host, because it
binds 0.0.0.0 (and its metrics 0.0.0.0:29000) unless told otherwise (docs/platform.md 2.5). It
listens on an internal port: the service's address is the front's (front.py), which passes every
path it does not serve itself to the router (which answers unknown paths 404, proxying none).

This module builds argv lists and probes HTTP; starting and stopping processes is the
supervisor's job.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request

from glmlab.serve.config import InstanceSpec, Mode, Role, ServeConfig


def router_argv(cfg: ServeConfig, instances: list[InstanceSpec], port: int | None = None,
                health_interval_s: float = 2.0) -> list[str]:
    """``port``: where it listens; the supervisor gives it an internal one behind the front
    (default ``cfg.port``, a router run on its own)."""
    argv = [sys.executable, "-m", "sglang_router.launch_router",
            "--host", cfg.host, "--port", str(cfg.port if port is None else port),
            "--prometheus-host", cfg.host, "--prometheus-port", str(cfg.metrics_port),
            "--policy", cfg.router_policy,
            "--request-timeout-secs", str(int(cfg.request_timeout_s)),
            # workers are started (and healthy) before the router: look for them every second
            "--worker-startup-check-interval", "1",
            "--worker-startup-timeout-secs", str(int(cfg.startup_timeout_s)),
            # a failed request is an answer the client must see, not something to replay
            "--disable-retries", "--disable-circuit-breaker",
            # a restarted worker is back in rotation one probe after it answers /health again
            # (the default, 60 s and 2 successes, would keep it out for two minutes)
            "--health-check-interval-secs", str(max(1, round(health_interval_s))),
            "--health-success-threshold", "1",
            "--log-level", "warn"]
    if cfg.mode is Mode.MIXED:
        return argv + ["--worker-urls", *(s.url for s in instances)]
    argv.append("--pd-disaggregation")
    for s in instances:
        if s.role is Role.PREFILL:
            argv += ["--prefill", s.url, str(s.bootstrap_port)]
    for s in instances:
        if s.role is Role.DECODE:
            argv += ["--decode", s.url]
    return argv


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports nothing listens on right now (for tests and notebooks)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def router_ready(url: str) -> bool:
    status, body = http_get(f"{url}/readiness")
    if status != 200:
        return False
    try:
        return json.loads(body).get("status") == "ready"
    except ValueError:
        return True


def router_sees(url: str, worker_url: str) -> bool | None:
    """Whether the router at ``url`` routes to ``worker_url`` (``GET /workers``, its health
    checks' verdict); None when the router does not answer."""
    status, body = http_get(f"{url}/workers")
    if status != 200:
        return None
    try:
        workers = json.loads(body).get("workers", [])
    except ValueError:
        return None
    return any(w.get("url") == worker_url and w.get("is_healthy") for w in workers)


def wait_until(predicate, timeout_s: float, what: str, alive=lambda: None,
               poll_s: float = 0.2) -> None:
    """Poll ``predicate`` until true; ``alive()`` returns an error message to stop early."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        problem = alive()
        if problem:
            raise RuntimeError(f"{what}: {problem}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(poll_s)
