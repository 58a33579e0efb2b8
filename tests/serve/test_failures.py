"""Killing the prefill worker while decode waits for transfers: decode frees everything, clients
get errors within the transfer timeout, and the supervisor stops the service naming the child."""

from __future__ import annotations

import asyncio
import threading
import time

from glmlab.bench.client import run_load
from glmlab.bench.workloads import BenchRequest
from tests.serve.conftest import http, pd_service

TIMEOUT_S = 10.0


def test_killing_prefill_frees_decode_and_stops_the_service(tmp_path, capsys):
    from glmlab.serve.config import TransferConfig

    svc = pd_service(tmp_path, TransferConfig(transfer_timeout_s=TIMEOUT_S,
                                              peer_check_interval_s=0.2))
    with svc:
        decode = svc.worker("decode0").url
        # eight long prompts queue up on the single prefill worker (about 1.3 s each on CPU)
        reqs = [BenchRequest(None, tuple((i * 31 + j) % 250 for j in range(3000)), 3000, 4)
                for i in range(8)]
        box = {}
        t = threading.Thread(target=lambda: box.update(
            out=asyncio.run(run_load(svc.url, "sglang", reqs, "tiny", timeout_s=60))))
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until decode holds rooms for several of them
            state = http(decode + "/server_info")[1]["internal_states"][0]
            if state["transfers_waiting"] >= 4:
                break
            time.sleep(0.05)
        assert state["transfers_waiting"] >= 4, state
        svc.worker("prefill0").proc.kill()
        killed_at = time.monotonic()
        t.join(TIMEOUT_S + 5)
        assert not t.is_alive(), "clients still waiting after the transfer timeout"
        results, _ = box["out"]
        failed = [r for r in results if not r.success]
        assert failed, "every request succeeded although the prefill died"
        assert time.monotonic() - killed_at < TIMEOUT_S + 5
        # decode released every page and slot it had reserved for the dead prefill's rooms
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            info = http(decode + "/server_info")[1]
            if info["internal_states"][0]["transfers_waiting"] == 0:
                break
            time.sleep(0.1)
        state = info["internal_states"][0]
        assert info["leak_check"] == "ok", info["leak_check"]
        assert state["transfers_waiting"] == 0 and state["num_parked_reqs"] == 0
        assert state["transfer_failures"] >= 1 and state["quarantined_requests"] == 0
        events = http(decode + "/pd_trace")[1]["events"]
        # Each room fails by one of three paths, which one depends on timing under load: sent to
        # the dead prefill (peer check), being sent when it died, or still waiting (timeout).
        paths = ("stopped answering", "cannot send the room message", f"within {TIMEOUT_S:.0f} s")
        reasons = [e["reason"] for e in events if e["event"] == "transfer_failed"]
        assert reasons and all(any(p in r for p in paths) for r in reasons), reasons
        # the decode worker still serves (its own health), the supervisor names the dead child
        assert http(decode + "/health")[0] == 200
        children = list(svc.children)
        assert svc.run_forever(poll_s=0.05) == 1
    err = capsys.readouterr().err
    assert "prefill0" in err and "exited with code" in err and "stopping the service" in err
    assert len(children) == 3 and all(c.proc.poll() is not None for c in children)
