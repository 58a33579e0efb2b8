"""Clients that leave mid-request, or stop reading a stream, at the service's one address (PD:
front, router, prefill, decode) and at a mixed worker's own port.

A request that is left is aborted in every engine that holds it: its pages, state slot and
transfer return to the pools (``/server_info`` rows back to zero, the radix tree holding only
evictable pages, each engine's leak check "ok"). The requests ask for thousands of tokens, so
they would still be running when the pools are checked had they not been aborted. A client
that stops reading is dropped after the send timeout, without slowing anyone else.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time

from glmlab.serve.limits import HttpLimits
from tests.serve.conftest import STREAM_SEND_TIMEOUT_S, http, mixed_service
from tests.serve.faultclient import Ask, gen, run_all, wait_quiet, worker_rows

LONG = 3000  # tokens a left request asked for: a minute of decoding on a CPU
QUIET_S = 15.0  # the pools must be empty this soon after the last client left


def prompt(i: int, n: int = 40) -> list[int]:
    return [(i * 13 + j * 7) % 250 for j in range(n)]


def test_clients_leaving_at_every_point_free_both_sides(pd):
    asks = [Ask("/generate", gen(prompt(i), LONG, stream=True), leave_after=k)
            for i, k in enumerate((1, 2, 5))]
    # a whole answer, left while the long prompt is at prefill, in transfer, or decoding
    asks += [Ask("/generate", gen(prompt(10 + i, 1500), 2000), leave_after=t)
             for i, t in enumerate((0.05, 0.4, 2.0))]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "tell me everything"}],
            "max_tokens": LONG, "ignore_eos": True}
    asks += [Ask("/v1/chat/completions", {**chat, "stream": True}, leave_after=3),
             Ask("/v1/chat/completions", chat, leave_after=1.0),
             Ask("/v1/completions", {"model": "tiny", "prompt": "once upon a time",
                                     "max_tokens": LONG,
                                     "ignore_eos": True, "stream": True}, leave_after=2)]
    seen = asyncio.run(run_all(pd.url, asks))
    assert all(s.left and not s.failed for s in seen), seen
    rows = wait_quiet(pd.url, QUIET_S)
    assert {r["role"] for r in rows} == {"prefill", "decode"}


def test_client_leaving_a_mixed_worker_frees_it(mixed):
    url = mixed.children[0].url
    asks = [Ask("/generate", gen(prompt(20), LONG, stream=True), leave_after=2),
            Ask("/generate", gen(prompt(21), LONG), leave_after=0.5)]
    seen = asyncio.run(run_all(url, asks))
    assert all(s.left and not s.failed for s in seen), seen
    deadline = time.monotonic() + QUIET_S
    while True:
        info = http(url + "/server_info")[1]
        if info["leak_check"] == "ok" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert info["leak_check"] == "ok", info["internal_states"]


def timed(url: str, i: int) -> float:
    t = time.monotonic()
    status, out = http(url + "/generate", gen(prompt(30 + i, 24), 6))
    assert status == 200 and out["meta_info"]["completion_tokens"] == 6, out
    return time.monotonic() - t


def stall(url: str) -> socket.socket:
    """A streaming request whose client reads the status line, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # fills at once
    stalled.connect((host, int(port)))
    # every /generate chunk repeats the output so far (with logprobs): megabytes in seconds
    body = json.dumps(gen(prompt(40), LONG, stream=True, return_logprob=True)).encode()
    stalled.sendall(b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert stalled.recv(64).startswith(b"HTTP/1.1 200")
    return stalled


def drained(stalled: socket.socket) -> bytes:
    """What the server had buffered, then its close (it dropped the stream)."""
    stalled.settimeout(10)
    received = b""
    try:
        while chunk := stalled.recv(1 << 20):
            received += chunk
    except ConnectionResetError:
        pass
    stalled.close()
    return received


def test_a_client_that_stops_reading_is_dropped_and_slows_nobody(pd):
    baseline = [timed(pd.url, i) for i in range(4)]
    stalled = stall(pd.url)
    started = time.monotonic()
    during = []
    while time.monotonic() - started < 60:
        during.append(timed(pd.url, len(during)))
        decode = next(r for r in worker_rows(pd.url) if r["role"] == "decode")
        if decode["open_requests"] == 0 and decode["running"] == 0:
            break  # the stalled request is gone from decode
        time.sleep(0.2)
    dropped_after = time.monotonic() - started
    assert dropped_after < 30, "the stalled stream was never dropped"
    # the others ran as usual meanwhile (its decoding shares the batch, its socket nothing)
    assert statistics.median(during) < 3 * statistics.median(baseline) + 0.5, (baseline, during)
    assert b"data: [DONE]" not in drained(stalled)  # dropped, not finished
    print(f"\nstalled reader dropped {dropped_after:.1f} s after it stopped reading "
          f"(send timeout {STREAM_SEND_TIMEOUT_S} s); others: baseline "
          f"{statistics.median(baseline):.2f} s, during {statistics.median(during):.2f} s")
    wait_quiet(pd.url, QUIET_S)



def test_a_worker_drops_a_client_that_stops_reading(tmp_path):
    """The same at a worker's own port (no front): its stream send times out."""
    limits = HttpLimits(stream_send_timeout_s=1.0)
    with mixed_service(tmp_path, limits=limits) as svc:
        url = svc.children[0].url
        stalled = stall(url)
        started = time.monotonic()
        while time.monotonic() - started < 30:
            state = http(url + "/server_info")[1]["internal_states"][0]
            if state["num_running_reqs"] == 0 and state["num_pending_requests"] == 0:
                break
            assert timed(url, 0) < 5  # served meanwhile
            time.sleep(0.2)
        dropped_after = time.monotonic() - started
        # 3000 tokens take this worker well over 20 s: it was dropped, not finished
        assert dropped_after < 20, "the stalled stream was never dropped"
        assert b"data: [DONE]" not in drained(stalled)
        print(f"\nworker dropped its stalled reader {dropped_after:.1f} s after it stopped "
              f"reading (send timeout {limits.stream_send_timeout_s} s)")
        assert http(url + "/server_info")[1]["leak_check"] == "ok"
