"""The supervisor's policy on a real child that needs no model (``python -m http.server``):
restarts with doubling backoff, a hung child killed after its failed probes, the service failed
past the restart limit with a message naming the child; and the flags that set all this."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from glmlab.cli import build_parser
from glmlab.commands.serve import build_service
from glmlab.serve.config import ServeConfig
from glmlab.serve.errors import RequestError
from glmlab.serve.limits import HttpLimits
from glmlab.serve.router import free_ports, http_get, router_argv, wait_until
from glmlab.serve.supervisor import Child, Service, Supervision, describe_exit


def web_service(tmp_path, supervision: Supervision) -> tuple[Service, Child]:
    (port,) = free_ports(1)
    cfg = ServeConfig(mode="mixed", mixed_ports=(port,), launch_router=False,
                      log_dir=str(tmp_path))
    svc = Service(cfg, tmp_path, "web", supervision=supervision, quiet=True, tick_s=0.02)
    url = f"http://127.0.0.1:{port}"
    child = Child("web0", "mixed", [sys.executable, "-m", "http.server", str(port), "--bind",
                                    "127.0.0.1", "--directory", str(tmp_path)],
                  {}, url, tmp_path / "web0.log", "/")
    child.spawn()
    svc.children.append(child)
    wait_until(lambda: http_get(url + "/")[0] == 200, 30, "web0")
    return svc.supervise(), child


def wait_state(svc: Service, child: Child, state: str, timeout_s: float = 30) -> None:
    wait_until(lambda: child.state == state, timeout_s, f"{child.name} {state}",
               lambda: svc.failure if state != "failed" else None, poll_s=0.01)


def test_restarts_back_off_then_the_service_fails_naming_the_child(tmp_path):
    sv = Supervision(worker_restarts=2, backoff_s=0.3, backoff_max_s=10, health_interval_s=0.1,
                     health_timeout_s=1.0)
    svc, child = web_service(tmp_path, sv)
    try:
        gaps = []
        for _ in range(2):
            pid = child.proc.pid
            child.proc.kill()
            wait_state(svc, child, "backoff")
            ok, why = svc.health()
            assert not ok and f"web0 (pid {pid}) was killed by signal 9 (SIGKILL)" in why, why
            died = child.died_at
            wait_state(svc, child, "up")
            assert child.proc.pid != pid and http_get(child.url + "/")[0] == 200
            gaps.append(child.started_at - died)
        # backoff_s, then doubled: each restart waited at least its delay
        assert gaps[0] >= 0.3 and gaps[1] >= 0.6, gaps
        assert svc.health() == (True, "ok")
        pid = child.proc.pid
        child.proc.terminate()  # a third death in the window: past the limit of 2
        wait_state(svc, child, "failed")
        assert f"web0 (pid {pid}) was killed by signal 15 (SIGTERM)" in svc.failure
        assert "restart limit reached (2 restarts in 600 s)" in svc.failure
        assert svc.health()[0] is False and child.proc.poll() is not None
        assert svc.run_forever(poll_s=0.01) == 1
    finally:
        svc.stop()


def test_a_hung_child_is_killed_and_restarted(tmp_path):
    sv = Supervision(worker_restarts=1, backoff_s=0.1, health_interval_s=0.1,
                     health_timeout_s=0.3, health_failures=2)
    svc, child = web_service(tmp_path, sv)
    try:
        pid = child.proc.pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_state(svc, child, "backoff")
        took = time.monotonic() - stopped
        assert f"web0 (pid {pid}) stopped answering / (2 probes of 0.3 s); killed it" in \
            child.last_death
        # two failed probes, each at most the timeout, one interval apart (plus scheduling)
        assert took < 2 * (sv.health_interval_s + sv.health_timeout_s) + 1.0, took
        wait_state(svc, child, "up")
        assert child.proc.pid != pid
    finally:
        svc.stop()


def test_flags_set_supervision_and_limits():
    args = build_parser().parse_args([
        "serve", "--supervise-worker-restarts", "0", "--supervise-router-restarts", "2",
        "--supervise-health-interval-s", "4", "--http-max-body-bytes", "1000",
        "--http-stream-send-timeout-s", "5"])
    svc = build_service(args, quiet=True)
    assert svc.supervision.worker_restarts == 0 and svc.supervision.router_restarts == 2
    assert svc.limits == HttpLimits(max_body_bytes=1000, stream_send_timeout_s=5.0)
    argv = router_argv(svc.cfg, svc.cfg.layout(), 31999, svc.supervision.health_interval_s)
    assert argv[argv.index("--port") + 1] == "31999"  # the router's port is internal
    assert argv[argv.index("--health-check-interval-secs") + 1] == "4"
    with pytest.raises(ValueError, match="restart limits"):
        Supervision(worker_restarts=-1)
    with pytest.raises(ValueError, match="stream_send_timeout_s"):
        HttpLimits(stream_send_timeout_s=0)


def test_limits_check_the_declared_length():
    limits = HttpLimits(max_body_bytes=100)
    limits.check_length(None)
    limits.check_length("100")
    with pytest.raises(RequestError) as e:
        limits.check_length("101")
    assert e.value.status == 413 and e.value.param == "body" and "100 bytes" in str(e.value)
    with pytest.raises(RequestError) as e:
        limits.check_length("lots")
    assert e.value.status == 400 and e.value.param == "Content-Length"
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(3) == "exited with code 3"
