"""The ranks of a TP worker: one leader process and ``tp - 1`` followers in lockstep.

The leader is the worker process the supervisor starts: it owns the HTTP endpoint, the scheduler
and every decision, driving a ``LeaderEngine`` (``glmlab.distributed.engine_tp``) whose call log
the followers replay, so each rank's engine holds the same requests in the same pages and state
slots of its own shard. ``start_leader`` spawns the followers (``python -m glmlab.serve.ranks``,
each dying with the leader), joins them in one process group over TCP on the loopback (gloo on the
CPU, NCCL on CUDA, the control messages over gloo either way) and builds this rank's engine.

PD workers also move each rank's own cache shard over NIXL (``shard.ShardTransfer``). The leader
posts ops into the log, which each follower's ``FollowerIO`` carries out on its rank:

- ``("add_peer", key, [peer info per rank])``: register the peer worker's agent of this rank;
- ``("push", rid, key, room message, room)``: WRITE the held request's rows into the same rank
  of decode (notification ``glmlab:{room}:ok:{rank}``);
- ``("drop", rid)``: forget a push (the request failed or was aborted);
- ``("leaks",)``: report what the rank's pools still hold.

After every command each follower reports, in order: ``("peer", key, name | None, error)``,
``("write", rid, "DONE" | "ERR", detail, bytes)``, ``("notif", raw bytes)`` received by its
agent, ``("leaks", [problems], engine stats)``. The leader admits a request on decode only when
every rank's notification has arrived, and releases it on prefill only when every rank's WRITE
is done.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from glmlab.distributed.engine_tp import Channel, LeaderEngine, follow, tp_engine
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups, free_port
from glmlab.engine.engine import Engine
from glmlab.serve.bootstrap import PeerInfo, RoomMessage
from glmlab.serve.config import Role, WorkerConfig, engine_config
from glmlab.serve.transfer import PendingWrite, WriteState

# followers wait in a collective between commands; an idle leader sends one this often
KEEPALIVE_S = 60.0
_GROUP_TIMEOUT = timedelta(minutes=30)


def agent_name(wc: WorkerConfig, rank: int) -> str:
    s = wc.spec
    return f"glmlab-{s.role.value}-{s.host}-{s.port}-r{rank}-{time.time_ns()}"


def _join(wc: WorkerConfig, rank: int, port: int) -> tuple[Engine, Channel]:
    """This rank in the worker's process group, and its engine on its shard."""
    device = wc.spec.rank_device(rank)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=wc.spec.tp, timeout=_GROUP_TIMEOUT)
    groups = ProcessGroups.build(ParallelLayout(tp=wc.spec.tp, ep=wc.spec.ep))
    engine = tp_engine(wc.model_dir, engine_config(wc.spec.role, wc.engine, device), groups)
    return engine, Channel(groups)


@dataclass
class Followers:
    """The leader's view of its followers: their processes and (PD roles) their shard infos."""

    procs: list[subprocess.Popen]
    infos: tuple[PeerInfo, ...]
    closing: threading.Event = field(default_factory=threading.Event)

    def watch(self) -> None:
        """A follower that dies takes the worker down, so the supervisor names it and stops."""
        def loop():
            while not self.closing.wait(0.5):
                for r, p in enumerate(self.procs, 1):
                    if p.poll() is not None and not self.closing.is_set():
                        print(f"glmlab: follower rank {r} (pid {p.pid}) exited with code "
                              f"{p.returncode}; stopping the worker", file=sys.stderr, flush=True)
                        os._exit(1)

        threading.Thread(target=loop, name="glmlab-followers", daemon=True).start()

    def close(self, engine: LeaderEngine, grace_s: float = 10.0) -> None:
        self.closing.set()
        with contextlib.suppress(Exception):  # followers already gone: nothing to release
            engine.close()
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if dist.is_initialized():
            dist.destroy_process_group()


def _die_with_parent() -> None:  # in the child, between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_leader(wc: WorkerConfig) -> tuple[LeaderEngine, Followers]:
    """Spawn the followers, join them, build rank 0's engine; the followers' shard infos."""
    faulthandler.enable()  # a crash (NIXL, UCX, gloo) leaves its stacks in the worker's log
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack to the log
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "glmlab.serve.ranks", "--config",
                               wc.to_json(), "--rank", str(r), "--port", str(port)],
                              stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
             for r in range(1, wc.spec.tp)]
    followers = Followers(procs, ())
    followers.watch()
    engine, channel = _join(wc, 0, port)
    infos = channel.gather(None)[1:]
    if wc.spec.role is not Role.MIXED:
        followers.infos = tuple(PeerInfo.from_json(i) for i in infos)
    return LeaderEngine(engine, channel, exchange=True), followers


class FollowerIO:
    """A follower's rank-local side: the leader's ops on this rank's shard, and its reports."""

    def __init__(self, engine: Engine, shard, rank: int):
        self.engine, self.shard, self.rank = engine, shard, rank
        self.writes: dict[str, PendingWrite] = {}
        self.out: list[tuple] = []

    def on_op(self, op: tuple) -> None:
        kind = op[0]
        if kind == "leaks":
            self.out.append(("leaks", self.engine.leaks(), self.engine.stats().as_dict()))
        elif kind == "add_peer":
            _, key, infos = op
            try:
                name = self.shard.add_peer(key, PeerInfo.from_json(infos[self.rank]))
                self.out.append(("peer", key, name, ""))
            except Exception as e:  # noqa: BLE001 - reported to the leader, which refuses
                self.out.append(("peer", key, None, f"rank {self.rank}: {e}"))
        elif kind == "push":
            _, rid, key, msg, room = op
            try:
                target = self.engine.export_target(rid)
                note = f"glmlab:{room}:ok:{self.rank}".encode()  # pd.notif's format
                self.writes[rid] = self.shard.push(target, RoomMessage.from_json(msg), key, note)
            except Exception as e:  # noqa: BLE001
                self.out.append(("write", rid, WriteState.ERR.value, f"rank {self.rank}: {e}",
                                 0))
        elif kind == "drop":
            w = self.writes.pop(op[1], None)
            if w is not None:
                self.shard.agent.release(w)
        else:
            raise ValueError(f"unknown op {kind!r} from the leader")

    def report(self) -> list[tuple]:
        if self.shard is not None:
            for rid, w in list(self.writes.items()):
                state = self.shard.agent.poll(w)
                if state is not WriteState.PROC:
                    del self.writes[rid]
                    self.out.append(("write", rid, state.value, f"rank {self.rank}", w.nbytes))
            self.out += [("notif", raw) for _, raw in self.shard.agent.take_notifs()]
        out, self.out = self.out, []
        return out


def follower_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a follower rank of a TP worker (started by its "
                                "leader, glmlab.serve.server)")
    p.add_argument("--config", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args(argv)
    wc = WorkerConfig.from_json(a.config)
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1)
    if not wc.spec.device.startswith("cuda"):
        torch.set_num_threads(wc.torch_threads)
    engine, channel = _join(wc, a.rank, a.port)
    shard = None
    if wc.spec.role is not Role.MIXED:
        from glmlab.serve.shard import ShardTransfer

        shard = ShardTransfer(engine, agent_name(wc, a.rank), a.rank)
    channel.gather(shard.info().to_json() if shard is not None else None)
    print(f"glmlab {wc.spec.name}: rank {a.rank} of {wc.spec.tp} following", flush=True)
    try:
        follow(engine, channel, handler=FollowerIO(engine, shard, a.rank))
    finally:
        if shard is not None:
            shard.close()
        dist.destroy_process_group()
    return 0


def reports_of(items: list[tuple[int, Any]], kind: str) -> list[tuple[int, tuple]]:
    """(rank, item) of the followers' report items of ``kind``."""
    return [(rank, it) for rank, report in items for it in report if it[0] == kind]


if __name__ == "__main__":
    sys.exit(follower_main())
