"""The engine under tensor parallelism: every rank runs the same ``Engine`` on its shard, in step.

Each rank builds an ordinary ``Engine`` around its ``apply_tp`` shard (``tp_engine`` from a
checkpoint through ``Engine.from_pretrained``, or ``build_tp_engine`` around a shard already in
memory), with pool sizes agreed across the group, so every rank owns the same page and
state-slot ids. The
engine is deterministic: given the same calls in the same order, every rank's scheduler makes the
same decisions, its forwards meet in the same all-reduces, and the replicated logits (the last
all-reduce feeds a replicated lm_head) sample the same tokens with the same seeded generators. So
a TP engine is N copies of one state machine fed one input log:

- offline (benchmarks, notebooks, ``LocalPD``): every rank runs the same driver program;
  ``same_on_all_ranks`` checks the outputs agree at the end;
- online (a server whose requests arrive on rank 0): rank 0 drives a ``LeaderEngine``, which
  applies each mutating call (add_request, abort, forget, complete_import, release_held) at once
  and logs it; each ``step()`` broadcasts the log since the last step, and the followers
  (``follow``) replay it and step too. The message also carries the leader's previous step's
  outputs, which each follower compares with its own, so a divergence (a nondeterministic kernel
  in a replicated op) stops the run loudly at the next step instead of corrupting it silently.
- rank-local work beside the engine (a PD worker's per-rank NIXL transfers of each rank's cache
  shard): the leader ``post``s opaque ops into the same log, which each follower hands to its
  ``RankHandler`` in log order; with ``exchange`` on, every command ends with each follower's
  ``report()`` gathered to the leader (``take_reports``), and ``sync()`` sends a command without a
  step (ops, polling, keep-alive while the engine is idle).

Why the whole engine and not only the forward: per-request state lives in each rank's own cache
(its heads' KDA state), so every state operation the engine does outside the forward (a fresh
slot's reset, a radix checkpoint's copy, a speculative commit, a PD import) must happen on every
rank too. Running the same engine everywhere does all of them, including speculative decoding,
without mirroring each one; what moves per step is a few hundred bytes of calls.

Model and cache code know nothing of this module. Mutate an engine only through the calls above
(a caller poking the radix tree of rank 0 alone would split the ranks).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from glmlab.core import InvalidRequest, RequestOutput
from glmlab.distributed.parallel import ProcessGroups
from glmlab.distributed.tp import apply_tp
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.model_runner import budget_inputs
from glmlab.model.glm import GLM5Model

MUTATING = ("add_request", "abort", "forget", "complete_import", "release_held", "flush_cache")
OP = "op"  # a logged rank-local action for each follower's RankHandler (not an engine call)


class LockstepError(RuntimeError):
    """The ranks of one TP engine stopped agreeing."""


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple
    kwargs: dict
    raised: bool  # the leader's call raised ValueError (a bad request): replaying must, too


@dataclass(frozen=True)
class Command:
    calls: tuple[Call, ...]
    check: tuple | None  # the leader's outputs of its previous step (``digest``)
    stop: bool = False
    step: bool = True  # False: replay the calls and ops only (``LeaderEngine.sync``)


class RankHandler(Protocol):
    """A follower's rank-local side: the ops the leader posts, and what it reports back."""

    def on_op(self, op: Any) -> None: ...

    def report(self) -> Any: ...  # after every command, gathered to the leader


def digest(outputs: Sequence[RequestOutput]) -> tuple:
    return tuple((o.rid, tuple(o.new_token_ids), o.finished) for o in outputs)


# ------------------------------------------------------------------------------ building
def agreed_config(cfg: EngineConfig, model: GLM5Model, group) -> EngineConfig:
    """``cfg`` with a byte budget every rank can afford (the smallest rank's), so all ranks size
    their pools alike and hand out the same ids. The budget is printed by rank 0 only."""
    pool = torch.tensor([budget_inputs(cfg, model).pool_bytes()], dtype=torch.int64)
    if group is not None:
        device = model.embed_tokens.weight.device
        pool = pool.to(device)
        dist.all_reduce(pool, op=dist.ReduceOp.MIN, group=group)
    first = group is None or dist.get_rank(group) == 0
    return dataclasses.replace(cfg, cache_bytes=int(pool.item()),
                               print_budget=cfg.print_budget and first)


def build_tp_engine(model: GLM5Model, cfg: EngineConfig, groups: ProcessGroups,
                    engine_cls: Callable[..., Engine] = Engine, **engine_kwargs) -> Engine:
    """An engine around this rank's shard (``model`` already transformed by ``apply_tp``)."""
    return engine_cls(model, agreed_config(cfg, model, groups.tp), **engine_kwargs)


def tp_engine(path: str | Path, cfg: EngineConfig, groups: ProcessGroups,
              engine_cls: type[Engine] = Engine, **engine_kwargs) -> Engine:
    """This rank's engine of a checkpoint: loaded as ``cfg`` says, sharded, pools agreed."""
    def shard(model: GLM5Model, c: EngineConfig) -> tuple[GLM5Model, EngineConfig]:
        model = apply_tp(model, groups)
        if model.embed_tokens.weight.is_cuda:  # the whole model's blocks back to the device
            gc.collect()  # before the budget reads free memory (cached blocks count as used)
            torch.cuda.empty_cache()
        return model, agreed_config(c, model, groups.tp)

    return engine_cls.from_pretrained(path, cfg, prepare=shard, **engine_kwargs)


# ------------------------------------------------------------------------------ channel
class Channel:
    """Rank 0 of the TP group broadcasts ``Command``s; the others receive them (CPU objects,
    over a gloo group even when the model's collectives run on NCCL)."""

    def __init__(self, groups: ProcessGroups):
        self.group = control_group(groups)
        self.src = dist.get_global_rank(self.group, 0) if self.group is not None else 0

    def send(self, command: Command) -> None:
        if self.group is not None:
            dist.broadcast_object_list([command], src=self.src, group=self.group)

    def recv(self) -> Command:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.src, group=self.group)
        return box[0]

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on the leader (in rank order), None elsewhere."""
        if self.group is None:
            return [value]
        leader = dist.get_rank(self.group) == 0
        out: list[Any] | None = [None] * dist.get_world_size(self.group) if leader else None
        dist.gather_object(value, out, dst=self.src, group=self.group)
        return out


def control_group(groups: ProcessGroups):
    """A gloo group over this rank's TP group (collective: every rank calls it, in step)."""
    info = groups.info
    if info.tp_size == 1:
        return None
    if dist.get_backend() == "gloo":
        return groups.tp
    mine = None
    for start in range(0, info.world_size, info.tp_size):
        ranks = list(range(start, start + info.tp_size))
        group = dist.new_group(ranks, backend="gloo")
        if info.rank in ranks:
            mine = group
    return mine


# ------------------------------------------------------------------------------ leader
class LeaderEngine:
    """Rank 0's engine: the ``Engine`` API, with mutating calls logged for the followers.

    Reads (``has_work``, ``request``, ``budget``, ``cache``, ``export_target``, ...) go to the
    local engine; ``close`` releases the followers. With ``exchange`` the followers run a
    ``RankHandler`` and report after every command."""

    def __init__(self, engine: Engine, channel: Channel, exchange: bool = False):
        self.engine, self.channel, self.exchange = engine, channel, exchange
        self._calls: list[Call] = []
        self._last: tuple | None = None
        self._reports: list[tuple[int, Any]] = []
        self.closed = False
        self.broken: str | None = None

    def __getattr__(self, name: str):
        if name == "engine":  # not set yet (unpickling, or __init__ failed)
            raise AttributeError(name)
        return getattr(self.engine, name)

    def _call(self, method: str, *args, **kwargs):
        try:
            result = getattr(self.engine, method)(*args, **kwargs)
        except ValueError:
            self._calls.append(Call(method, args, kwargs, raised=True))
            raise
        self._calls.append(Call(method, args, kwargs, raised=False))
        return result

    def add_request(self, *args, **kwargs) -> str:
        if kwargs.get("grammar") is not None:  # refused before it is logged: nothing to replay
            raise InvalidRequest("params", "structured output is not served by a TP worker yet "
                                 "(a grammar matcher cannot be replayed on the follower ranks)")
        return self._call("add_request", *args, **kwargs)

    def abort(self, rid: str) -> RequestOutput | None:
        return self._call("abort", rid)

    def forget(self, rid: str) -> None:
        self._call("forget", rid)

    def complete_import(self, rid: str, first_token: int, logprob=None,
                        draft_state: bool = False, samples=()) -> list[RequestOutput]:
        return self._call("complete_import", rid, first_token, logprob, draft_state=draft_state,
                          samples=samples)

    def release_held(self, rid: str) -> None:
        self._call("release_held", rid)

    def flush_cache(self) -> bool:
        return self._call("flush_cache")

    def post(self, op: Any) -> None:
        """Log ``op`` for every follower's handler (the leader does its own part itself)."""
        self._calls.append(Call(OP, (op,), {}, raised=False))

    @property
    def pending(self) -> bool:
        """Calls or ops logged that the followers have not received yet."""
        return bool(self._calls)

    def step(self) -> list[RequestOutput]:
        self._send(stop=False)
        outputs = self.engine.step()
        self._last = digest(outputs)
        self._collect()
        return outputs

    def sync(self) -> list[tuple[int, Any]]:
        """Send the log without a step; with ``exchange``, the followers' reports since the
        last ``take_reports`` (this command's included)."""
        self._send(stop=False, step=False)
        self._collect()
        return self.take_reports()

    def take_reports(self) -> list[tuple[int, Any]]:
        """(rank, report) of every follower for each command since the last call."""
        out, self._reports = self._reports, []
        return out

    def _collect(self) -> None:
        if self.exchange:
            reports = self._exchange(lambda: self.channel.gather(None))
            self._reports += [(rank, r) for rank, r in enumerate(reports) if rank]

    def _exchange(self, fn: Callable[[], Any]) -> Any:
        """A collective of the control channel; one that fails leaves the ranks out of step, so
        every later call raises too."""
        if self.broken is not None:
            raise LockstepError(f"the ranks are out of step since: {self.broken}")
        try:
            return fn()
        except Exception as e:
            self.broken = f"{type(e).__name__}: {e}"
            raise LockstepError(f"the control channel failed: {self.broken}") from e

    def close(self) -> None:
        """Let the followers return (after replaying the calls made since the last step)."""
        if not self.closed:
            self._send(stop=True)
            self.closed = True

    def _send(self, stop: bool, step: bool = True) -> None:
        if self.closed:
            raise LockstepError("the followers were released (close) already")
        command = Command(tuple(self._calls), self._last, stop, step)
        self._exchange(lambda: self.channel.send(command))
        self._calls = []


# ------------------------------------------------------------------------------ followers
@dataclass
class FollowStats:
    steps: int = 0
    calls: int = 0
    added: list[str] = field(default_factory=list)  # ids of the requests added, in order
    outputs: list[tuple] = field(default_factory=list)  # digests of every step, in order


def follow(engine: Engine, channel: Channel, keep_outputs: bool = False,
           handler: RankHandler | None = None) -> FollowStats:
    """Replay the leader's calls and steps until it closes; returns what was done. With a
    ``handler`` (the leader's ``exchange`` on) ops go to it and it reports after each command."""
    stats, last = FollowStats(), None
    while True:
        cmd = channel.recv()
        if cmd.check is not None and cmd.check != last:
            raise LockstepError(f"rank {dist.get_rank()} diverged from the leader at step "
                                f"{stats.steps}: leader {cmd.check}, here {last}")
        for call in cmd.calls:
            if call.method == OP:
                if handler is None:
                    raise LockstepError("the leader posted an op but this rank has no handler")
                handler.on_op(call.args[0])
                continue
            result = _replay(engine, call)
            stats.calls += 1
            if call.method == "add_request" and result is not None:
                stats.added.append(result)
        if cmd.stop:
            return stats
        if cmd.step:
            last = digest(engine.step())
            stats.steps += 1
            if keep_outputs:
                stats.outputs.append(last)
        if handler is not None:
            channel.gather(handler.report())


def _replay(engine: Engine, call: Call) -> Any:
    if call.method not in MUTATING:
        raise LockstepError(f"unexpected call {call.method!r} in the leader's log")
    try:
        result = getattr(engine, call.method)(*call.args, **call.kwargs)
    except ValueError as e:
        if not call.raised:
            raise LockstepError(f"{call.method} failed here but not on the leader: {e}") from e
        return None
    if call.raised:
        raise LockstepError(f"{call.method} raised on the leader but not here")
    return result


def same_on_all_ranks(value: Any, group) -> None:
    """Raise ``LockstepError`` unless every rank of ``group`` holds an equal ``value``."""
    if group is None:
        return
    values: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    bad = [r for r, v in enumerate(values) if v != values[0]]
    if bad:
        raise LockstepError(f"ranks {bad} of the TP group disagree with rank 0")
