"""NIXL transfer between two real processes on loopback (UCX over TCP)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
import torch

from glmlab.serve.transfer import (
    Region,
    RowCopy,
    TransferAgent,
    TransferError,
    descriptors,
    merge_runs,
)

UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}


def test_merge_runs_fuses_only_continuing_rows():
    copies = [RowCopy("a", 0, 10), RowCopy("a", 1, 11), RowCopy("a", 2, 13), RowCopy("b", 3, 14)]
    assert merge_runs(copies) == [RowCopy("a", 0, 10, 2), RowCopy("a", 2, 13), RowCopy("b", 3, 14)]


def test_descriptors_check_layout_and_range():
    local = {"a": Region("a", 1000, 8, 4)}
    src, dst, n = descriptors([RowCopy("a", 1, 2, 2)], local, {"a": Region("a", 5000, 8, 4)})
    assert n == 16 and src.tolist() == [[1008, 16, 0]] and dst.tolist() == [[5016, 16, 0]]
    with pytest.raises(TransferError, match="different cache layouts"):
        descriptors([RowCopy("a", 0, 0)], local, {"a": Region("a", 5000, 16, 4)})
    with pytest.raises(TransferError, match="out of range"):
        descriptors([RowCopy("a", 3, 3, 2)], local, {"a": Region("a", 5000, 8, 4)})
    with pytest.raises(TransferError, match="not registered"):
        descriptors([RowCopy("b", 0, 0)], local, {"a": Region("a", 5000, 8, 4)})


def _target(conn, rows: int) -> None:
    """The decode side: register zeroed tensors, publish them, report what arrived."""
    os.environ.update(UCX_ENV)
    kv = torch.zeros(rows, 16, dtype=torch.bfloat16)
    state = torch.zeros(4, 3, 5, dtype=torch.float32)
    agent = TransferAgent(f"target-{os.getpid()}", {"kv": kv, "state": state})
    conn.send((agent.metadata(), {n: r.to_json() for n, r in agent.regions.items()}))
    agent.add_peer(conn.recv())
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(got) < 2:
        got.extend(m for _, m in agent.take_notifs())
        time.sleep(0.001)
    conn.send((got, kv.clone(), state.clone()))
    conn.recv()  # hold the agent until the initiator is done


def _spawn(rows: int):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_target, args=(child, rows), daemon=True)
    proc.start()
    return proc, parent


@pytest.fixture
def ucx_env(monkeypatch):
    for k, v in UCX_ENV.items():
        monkeypatch.setenv(k, v)


def test_write_rows_and_notify_between_processes(ucx_env):
    proc, conn = _spawn(rows=64)
    try:
        md, regions = conn.recv()
        kv = torch.randn(64, 16).to(torch.bfloat16)
        state = torch.randn(4, 3, 5)
        agent = TransferAgent(f"init-{os.getpid()}", {"kv": kv, "state": state})
        peer = agent.add_peer(md)
        conn.send(agent.metadata())
        remote = {n: Region.from_json(r) for n, r in regions.items()}
        # rows 8..15 -> 40..47 (one run), row 3 -> 0, and state slot 1 -> 2
        copies = [RowCopy("kv", 8 + i, 40 + i) for i in range(8)]
        copies += [RowCopy("kv", 3, 0), RowCopy("state", 1, 2)]
        w = agent.write(peer, copies, remote, b"room-1:done")
        assert w.num_descs == 3 and w.nbytes == 9 * 32 + 60
        agent.wait(w, timeout_s=20)
        agent.wait(agent.write(peer, [], remote, b"room-2:done"), timeout_s=5)
        got, kv_d, state_d = conn.recv()
        assert sorted(got) == [b"room-1:done", b"room-2:done"]
        assert torch.equal(kv_d[40:48], kv[8:16]) and torch.equal(kv_d[0], kv[3])
        assert kv_d[1:40].abs().sum() == 0 and kv_d[48:].abs().sum() == 0
        assert torch.equal(state_d[2], state[1]) and state_d[[0, 1, 3]].abs().sum() == 0
        conn.send("bye")
        agent.close()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def test_write_to_a_dead_peer_fails_within_the_timeout(ucx_env):
    proc, conn = _spawn(rows=8)
    md, regions = conn.recv()
    src = torch.ones(8, 16, dtype=torch.bfloat16)
    agent = TransferAgent(f"init-dead-{os.getpid()}", {"kv": src, "state": torch.ones(4, 3, 5)})
    peer = agent.add_peer(md)
    proc.kill()
    proc.join(10)
    remote = {n: Region.from_json(r) for n, r in regions.items()}
    t0 = time.monotonic()
    with pytest.raises(TransferError):
        w = agent.write(peer, [RowCopy("kv", 0, 0, 8)], remote, b"room-x:done")
        agent.wait(w, timeout_s=5)
    assert time.monotonic() - t0 < 8
    agent.close()
