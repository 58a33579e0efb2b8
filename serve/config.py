"""Configuration of a service: which instances run where, and how each worker behaves.

``ServeConfig`` is what ``glmlab serve`` parses (flags generated from its fields); ``layout()``
turns it into one ``InstanceSpec`` per worker process. ``WorkerConfig`` is what one worker reads.
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

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def name(self) -> str:
        return f"{self.role.value}{self.index}"


@dataclass(frozen=True)
class ServeConfig:
    model: str = "tiny"  # a checkpoint directory, or a preset written once (tiny, slice:N)
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
        self.layout()  # every other inconsistency (devices, duplicate ports) fails here

    def layout(self) -> list[InstanceSpec]:
        if self.mode is Mode.MIXED:
            return [InstanceSpec(Role.MIXED, i, self.host, _pick(self.mixed_ports, i, 31000),
                                 _pick(self.prefill_devices, i, "cpu"))
                    for i in range(self.num_mixed)]
        out = [InstanceSpec(Role.PREFILL, i, _pick(self.prefill_hosts, i, "127.0.0.1"),
                            _pick(self.prefill_ports, i, 31000 + i),
                            _pick(self.prefill_devices, i, "cpu"),
                            _pick(self.bootstrap_ports, i, 8998 + i))
               for i in range(self.num_prefill)]
        out += [InstanceSpec(Role.DECODE, i, _pick(self.decode_hosts, i, "127.0.0.1"),
                             _pick(self.decode_ports, i, 31500 + i),
                             _pick(self.decode_devices, i, "cpu"))
                for i in range(self.num_decode)]
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
