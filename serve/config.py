"""Configuration of a service: which instances run where, and how each worker behaves.

``ServeConfig`` is what ``glmlab serve`` parses (flags generated from its fields); ``layout()``
turns it into one ``InstanceSpec`` per worker. ``WorkerConfig`` is what one worker reads. A
worker of ``tp`` ranks (``--prefill-tp``, ``--decode-tp``; mixed workers take decode's) is one
leader process and ``tp - 1`` followers (``glmlab.serve.ranks``); on CUDA rank r runs on the
instance's device index + r, so ``--decode-devices cuda:4 --decode-tp 4`` takes cuda:4..7.
Engine knobs are not repeated here: each worker gets its role's engine options as a dict of
``EngineConfig`` fields (flags generated from that dataclass by the command); ``engine_config``
turns them, with the role's defaults and the instance's device, into the engine's config.

The seed's layouts, for reference (ports as in its launch commands):
- 1P1D on one node: ``--num-prefill 1 --num-decode 1`` (the default).
- 3P1D on two nodes A and B: ``--prefill-hosts A,A,B --prefill-ports 31000,31001,31000
  --bootstrap-ports 8998,8999,8998 --decode-hosts B --decode-ports 31500 --host A`` and, on each
  node, ``--launch-hosts`` naming that node, so each launches its own instances (and node A the
  router).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from enum import Enum

from glmlab.engine.config import EngineConfig, RadixMode
from glmlab.serve.limits import HttpLimits

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Role(str, Enum):
    MIXED = "mixed"  # prefill and decode in one engine (no transfer)
    PREFILL = "prefill"
    DECODE = "decode"


class Mode(str, Enum):
    PD = "pd"  # prefill and decode instances behind sglang-router in PD mode
    MIXED = "mixed"  # mixed instances behind sglang-router in regular mode


@dataclass(frozen=True)
class TransferConfig:
    """How prefill pushes cache rows to decode, and how long each side waits."""

    ucx_tls: str = "tcp,self"  # UCX needs tcp even on one host (docs/platform.md 2.4)
    ucx_net_devices: str = "lo"  # pinned: unpinned UCX can hang on multi-NIC hosts (ANCHORS 4.5)
    bootstrap_timeout_s: float = 60.0  # prefill waits this long for decode's room message
    transfer_timeout_s: float = 60.0  # decode waits this long for a request's cache to land
    peer_check_interval_s: float = 0.5  # decode checks that its prefill is alive this often

    def ucx_env(self) -> dict[str, str]:
        return {"UCX_TLS": self.ucx_tls, "UCX_NET_DEVICES": self.ucx_net_devices}


@dataclass(frozen=True)
class InstanceSpec:
    """One worker process of the service."""

    role: Role
    index: int
    host: str
    port: int
    device: str = "cpu"
    bootstrap_port: int | None = None  # prefill only
    tp: int = 1  # ranks of this worker (tensor parallel), each with its own cache shard
    ep: int = 1  # expert parallel: 1 or tp

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def gpus(self) -> list[int] | None:
        """The CUDA index of each rank (``cuda:A`` or ``cuda:A-B``: A + rank), None off CUDA or
        for a device string that names no index."""
        if not self.device.startswith("cuda"):
            return None
        lo, _, hi = (self.device.partition(":")[2] or "0").partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        first, last = int(lo), int(hi) if hi else int(lo) + self.tp - 1
        if self.tp > 1 and last - first + 1 != self.tp:
            raise ValueError(f"{self.name}: {self.device} names {last - first + 1} GPUs for "
                             f"tp {self.tp}")
        return list(range(first, last + 1))

    def rank_device(self, rank: int) -> str:
        """The device of rank ``rank``: the instance's CUDA index + rank, or the CPU."""
        gpus = self.gpus()
        if self.tp == 1 or gpus is None:
            return self.device
        return f"cuda:{gpus[rank]}"

    @property
    def name(self) -> str:
        return f"{self.role.value}{self.index}"


@dataclass(frozen=True)
class ServeConfig:
    # a checkpoint directory, the committed trained ``small``, or a random preset written once
    # (tiny, slice:N)
    model: str = "small"
    served_model_name: str = ""  # default: the preset name or the directory's name
    mode: Mode = Mode.PD
    host: str = "127.0.0.1"  # where the router listens
    port: int = 30000
    num_prefill: int = 1
    num_decode: int = 1
    num_mixed: int = 1
    prefill_hosts: tuple[str, ...] = ()  # one per prefill instance; default: all on 127.0.0.1
    prefill_ports: tuple[int, ...] = ()  # default: 31000, 31001, ...
    bootstrap_ports: tuple[int, ...] = ()  # default: 8998, 8999, ...
    decode_hosts: tuple[str, ...] = ()
    decode_ports: tuple[int, ...] = ()  # default: 31500, 31501, ...
    mixed_ports: tuple[int, ...] = ()  # default: 31000, 31001, ...
    prefill_devices: tuple[str, ...] = ("cpu",)  # one per instance, or one for all
    decode_devices: tuple[str, ...] = ("cpu",)
    prefill_tp: int = 1  # ranks per prefill worker (one process each, gloo on CPU / NCCL)
    prefill_ep: int = 1  # expert parallel inside a prefill worker: 1 or prefill_tp
    decode_tp: int = 1  # ranks per decode (and mixed) worker
    decode_ep: int = 1
    launch_hosts: tuple[str, ...] = ()  # hosts whose instances this node launches; default: all
    launch_router: bool = True
    router_policy: str = "round_robin"  # random | round_robin | cache_aware | power_of_two
    router_metrics_port: int = 0  # 0: port + 90
    request_timeout_s: float = 600.0
    startup_timeout_s: float = 300.0
    torch_threads: int = 1  # per CPU worker; several workers share the cores
    reasoning_parser: str = ""  # glm45: <think> -> reasoning_content (chat); "" = off
    tool_call_parser: str = ""  # glm47 | glm45: GLM tool calls -> tool_calls (chat); "" = off
    log_dir: str = ""  # worker and router logs; default: a temporary directory
    transfer: TransferConfig = field(default_factory=TransferConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))  # flags arrive as plain strings
        if self.mode is Mode.PD and (self.num_prefill < 1 or self.num_decode < 1):
            raise ValueError("PD mode needs at least one prefill and one decode instance")
        if self.mode is Mode.MIXED and self.num_mixed < 1:
            raise ValueError("mixed mode needs at least one instance")
        for name, n in (("prefill_hosts", self.num_prefill), ("prefill_ports", self.num_prefill),
                        ("bootstrap_ports", self.num_prefill), ("decode_hosts", self.num_decode),
                        ("decode_ports", self.num_decode), ("mixed_ports", self.num_mixed)):
            given = getattr(self, name)
            if given and len(given) != n:
                raise ValueError(f"--{name.replace('_', '-')} lists {len(given)} values "
                                 f"for {n} instances")
        for role in ("prefill", "decode"):
            tp, ep = getattr(self, f"{role}_tp"), getattr(self, f"{role}_ep")
            if tp < 1 or ep not in (1, tp):
                raise ValueError(f"--{role}-tp {tp} --{role}-ep {ep}: tp must be >= 1 and ep 1 "
                                 "or equal to tp (experts split over the TP ranks)")
        self.layout()  # every other inconsistency (devices, duplicate ports) fails here

    def layout(self) -> list[InstanceSpec]:
        if self.mode is Mode.MIXED:
            out = [InstanceSpec(Role.MIXED, i, self.host, _pick(self.mixed_ports, i, 31000),
                                _pick(self.prefill_devices, i, "cpu"), tp=self.decode_tp,
                                ep=self.decode_ep)
                   for i in range(self.num_mixed)]
            _check_gpus(out)
            return out
        out = [InstanceSpec(Role.PREFILL, i, _pick(self.prefill_hosts, i, "127.0.0.1"),
                            _pick(self.prefill_ports, i, 31000 + i),
                            _pick(self.prefill_devices, i, "cpu"),
                            _pick(self.bootstrap_ports, i, 8998 + i), self.prefill_tp,
                            self.prefill_ep)
               for i in range(self.num_prefill)]
        out += [InstanceSpec(Role.DECODE, i, _pick(self.decode_hosts, i, "127.0.0.1"),
                             _pick(self.decode_ports, i, 31500 + i),
                             _pick(self.decode_devices, i, "cpu"), tp=self.decode_tp,
                             ep=self.decode_ep)
                for i in range(self.num_decode)]
        _check_gpus(out)
        used: dict[tuple[str, int], str] = {}
        for s in out:
            for port in (s.port, s.bootstrap_port):
                if port is None:
                    continue
                if (s.host, port) in used:
                    raise ValueError(f"{s.name} and {used[s.host, port]} both use "
                                     f"{s.host}:{port}")
                used[s.host, port] = s.name
        return out

    def launched_here(self) -> list[InstanceSpec]:
        hosts = set(self.launch_hosts)
        return [s for s in self.layout() if not hosts or s.host in hosts]

    @property
    def metrics_port(self) -> int:
        return self.router_metrics_port or self.port + 90


def _check_gpus(specs: list[InstanceSpec]) -> None:
    """No GPU runs a rank of a TP worker and anything else (rank r takes its device index + r;
    single-rank workers may share a GPU, as a one-GPU 1P1D does)."""
    used: dict[tuple[str, int], tuple[str, int]] = {}
    for s in specs:
        for r, gpu in enumerate(s.gpus() or ()):
            other = used.get((s.host, gpu))
            if other is not None and max(other[1], s.tp) > 1:
                raise ValueError(f"{s.name} rank {r} and {other[0]} both use cuda:{gpu} on "
                                 f"{s.host} (rank r of a tp worker runs on its device + r)")
            used[s.host, gpu] = (f"{s.name} rank {r}", s.tp)


def _pick(values: tuple, i: int, default):
    if not values:
        return default
    return values[i] if len(values) > 1 else values[0]


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one worker process needs; passed to it as JSON."""

    spec: InstanceSpec
    model_dir: str
    served_model_name: str
    torch_threads: int = 1
    reasoning_parser: str = ""
    tool_call_parser: str = ""
    engine: dict = field(default_factory=dict)  # the role's engine options, by field name
    transfer: TransferConfig = field(default_factory=TransferConfig)
    limits: HttpLimits = field(default_factory=HttpLimits)  # body cap, stream send timeout

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=lambda e: e.value)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        d = json.loads(text)
        spec = d.pop("spec")
        spec["role"] = Role(spec["role"])
        return cls(spec=InstanceSpec(**spec), transfer=TransferConfig(**d.pop("transfer")),
                   limits=HttpLimits(**d.pop("limits", {})), **d)


# role -> the radix mode that makes sense for it (kv_only on decode: the seed's cache)
DEFAULT_RADIX = {Role.MIXED: RadixMode.KV_AND_STATE, Role.PREFILL: RadixMode.KV_AND_STATE,
                 Role.DECODE: RadixMode.KV_ONLY}


def engine_config(role: Role, options: dict, device: str) -> EngineConfig:
    """The engine config of one worker: the role's defaults, then ``options`` (field name ->
    JSON value, sub-configs as dicts of their fields), on ``device``."""
    hints = typing.get_type_hints(EngineConfig)
    values = {"radix": DEFAULT_RADIX[role], "print_budget": False, **options, "device": device}
    for name, value in values.items():
        if name not in hints:
            raise ValueError(f"{name!r} is not an engine option (EngineConfig has no such field)")
        sub = next((a for a in (hints[name], *typing.get_args(hints[name]))
                    if dataclasses.is_dataclass(a)), None)
        if sub is not None and isinstance(value, dict):
            values[name] = sub(**value)
    return EngineConfig(**values)


# what a prefill instance's drafter must share with decode's for the hand-off to be meaningful
_HANDOFF_FIELDS = ("algorithm", "draft_path", "draft_kv_dtype")


def prefill_options(prefill: dict, decode: dict) -> dict:
    """Prefill's engine options under PD speculation. Speculation runs on decode workers; prefill
    only lets the same drafter learn each prompt, so decode's first cycle has the drafter state a
    mixed engine would (``glmlab.speculative.handoff``). Prefill therefore takes decode's
    speculative settings when it has none of its own; settings that change what is sent must
    agree, and prefill alone speculating is refused."""
    p, d = prefill.get("speculative"), decode.get("speculative")
    if d is None:
        if p is not None:
            raise ValueError("speculative decoding runs on decode workers: give "
                             "--speculative-algorithm (both roles) or --decode-speculative-*")
        return prefill
    if p is None:
        return {**prefill, "speculative": d}
    ps, ds = (engine_config(Role.MIXED, {"speculative": x}, "cpu").speculative for x in (p, d))
    bad = [f for f in _HANDOFF_FIELDS if getattr(ps, f) != getattr(ds, f)]
    if bad:
        raise ValueError("prefill and decode drafters differ in " + ", ".join(
            f"{f} ({getattr(ps, f)!r} vs {getattr(ds, f)!r})" for f in bad)
            + ": decode continues from the drafter state prefill computes")
    return prefill
