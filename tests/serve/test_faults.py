"""Killed and hung processes of a 1P1D service, seen from its clients (docs/serving.md).

One supervised service (restart limit 1 per component, short backoff and probes) goes through
four faults in order, each with requests in flight, streaming and not:

1. the router is killed: in-flight requests get a 502 / an SSE error event naming the router at
   once, new ones a 503 while it restarts, then requests succeed again;
2. the decode worker is killed: the same, naming decode0; prefill's pools come back empty;
3. the prefill worker is killed while decode waits for transfers: decode fails each waiting room
   (502 naming the room and the prefill) and frees it; after the restart, decode pairs with the
   new prefill and requests succeed;
4. the decode worker hangs (SIGSTOP): its health probes fail, the supervisor kills it, which ends
   the hang for its clients; it was already restarted once, so the service fails: ``/health``
   answers 503 naming decode0, and ``run_forever`` returns 1 with the same message.

Every error must arrive well before the configured timeouts (``TRANSFER``), measured per request.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from glmlab.serve.config import TransferConfig
from glmlab.serve.supervisor import Supervision
from tests.serve.conftest import http, pd_service
from tests.serve.faultclient import Ask, InFlight, gen, wait_quiet, worker_rows

TRANSFER = TransferConfig(transfer_timeout_s=20, bootstrap_timeout_s=20,
                          peer_check_interval_s=0.2)
SUPERVISION = Supervision(router_restarts=1, worker_restarts=1, backoff_s=0.2,
                          health_interval_s=0.5, health_timeout_s=1.0, health_failures=3)
# a hung child is killed after health_failures probes: at most this long after it stops
HANG_BOUND_S = SUPERVISION.health_failures * (SUPERVISION.health_interval_s
                                              + SUPERVISION.health_timeout_s) + 1.0
SHORT = [(i * 7 + 3) % 250 for i in range(24)]
TIMES: dict[str, list[float]] = {}  # fault -> seconds from the fault to each client's error


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    with pd_service(tmp_path_factory.mktemp("faults"), TRANSFER, supervision=SUPERVISION) as s:
        yield s
    for fault, waited in TIMES.items():  # shown with -s: the numbers docs/serving.md quotes
        print(f"{fault}: time to error {min(waited):.2f}-{max(waited):.2f} s "
              f"({len(waited)} requests)")


def long_running(n: int = 4) -> list[Ask]:
    """Requests that are mid-decode for seconds: half streamed, half whole."""
    return [Ask("/generate", gen([(i * 11 + j) % 250 for j in range(20)], 600, stream=i % 2 == 0))
            for i in range(n)]


def wait_decoding(svc, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = {r["role"]: r for r in worker_rows(svc.url)}
        if rows["decode"].get("running", 0) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} requests never ran on decode: {rows}")


def errors_after(seen, at: float, fault: str, bound_s: float) -> list[str]:
    """Every request failed, within ``bound_s`` of the fault, a stream with an error event and
    then [DONE]; returns their messages."""
    assert all(s.failed for s in seen), seen
    assert all(s.done for s in seen if s.status == 200), seen  # streams end well-formed
    waited = [s.ended_at - at for s in seen]
    TIMES[fault] = waited
    assert max(waited) < bound_s, waited
    return [s.error or s.transport for s in seen]


def recovered(svc) -> None:
    svc.wait_healthy(120)
    assert http(svc.url + "/health")[0] == 200
    status, out = http(svc.url + "/generate", gen(SHORT, 4))
    assert status == 200 and out["meta_info"]["completion_tokens"] == 4, out
    wait_quiet(svc.url)


def test_killed_router(svc):
    router = svc.worker("router")
    pid = router.proc.pid
    flight = InFlight(svc.url, long_running())
    wait_decoding(svc, 4)
    router.proc.kill()
    at = time.monotonic()
    while svc.health()[0]:  # the supervisor has reaped it: nothing listens on its port now
        time.sleep(0.005)
    status, out = http(svc.url + "/generate", gen(SHORT, 4))  # while it restarts
    assert status == 503, out
    assert "router is not answering" in out["error"]["message"] and f"pid {pid}" in \
        out["error"]["message"], out
    seen = flight.join(30)
    for message in errors_after(seen, at, "killed router", 2.0):
        assert f"router (pid {pid}) was killed by signal 9" in message, message
    assert {s.status for s in seen} == {200, 502}  # 200: streams that had begun, then an event
    recovered(svc)
    assert svc.worker("router").proc.pid != pid


def test_killed_decode(svc):
    decode = svc.worker("decode0")
    pid = decode.proc.pid
    flight = InFlight(svc.url, long_running())
    wait_decoding(svc, 4)
    decode.proc.kill()
    at = time.monotonic()
    seen = flight.join(30)
    for message in errors_after(seen, at, "killed decode", 2.0):
        assert f"decode0 (pid {pid}) was killed by signal 9" in message, message
    whole = [s for s in seen if s.status != 200]
    assert whole and all(s.status == 502 and "Decode server error" in s.error for s in whole)
    recovered(svc)


def test_killed_prefill_mid_transfer(svc):
    prefill = svc.worker("prefill0")
    pid = prefill.proc.pid
    # long prompts queue on the one prefill worker (about a second each on a CPU): decode holds
    # pages and a state slot for each while it waits for their transfers
    asks = [Ask("/generate", gen([(i * 31 + j) % 250 for j in range(2500)], 4, stream=i % 2 == 1))
            for i in range(6)]
    flight = InFlight(svc.url, asks)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = {r["role"]: r for r in worker_rows(svc.url)}
        if rows["decode"]["pending_transfers"] >= 3:
            break
        time.sleep(0.05)
    assert rows["decode"]["pending_transfers"] >= 3, rows
    prefill.proc.kill()
    at = time.monotonic()
    seen = flight.join(40)
    failed = [s for s in seen if s.failed]
    assert len(failed) >= 3, seen  # the ones still waiting; one may have landed before
    for s in failed:  # each names the fault: decode's view of the room, or the supervisor's
        assert f"prefill0 (pid {pid}) was killed by signal 9" in s.error or \
            "stopped answering" in s.error, s
    errors_after(failed, at, "killed prefill mid-transfer", TRANSFER.transfer_timeout_s / 2)
    recovered(svc)  # decode pairs with the new prefill at the first room it sends


def test_hung_decode_is_killed_and_the_service_fails(svc, capsys):
    decode = svc.worker("decode0")
    pid = decode.proc.pid
    flight = InFlight(svc.url, long_running())
    wait_decoding(svc, 4)
    os.kill(pid, signal.SIGSTOP)  # alive, answering nothing: what a wedged GPU looks like
    at = time.monotonic()
    seen = flight.join(30)
    for message in errors_after(seen, at, "hung decode", HANG_BOUND_S):
        assert f"decode0 (pid {pid}) stopped answering /health" in message, message
    # decode0 had been restarted once already (test_killed_decode): the limit is reached
    status, out = http(svc.url + "/health")
    assert status == 503, out
    message = out["error"]["message"]
    assert "decode0" in message and "restart limit reached" in message, message
    assert svc.run_forever(poll_s=0.05) == 1
    err = capsys.readouterr().err
    assert f"decode0 (pid {pid}) stopped answering /health" in err and "stopping the service" \
        in err, err
    assert all(c.proc.poll() is not None for c in svc.children)
