"""glmlab serve: the prefill/decode-disaggregated service behind sglang-router (or mixed workers).

With no arguments: the tiny checkpoint (written once into the cache directory), one prefill and
one decode worker on the CPU, NIXL over UCX TCP between them, sglang-router on 127.0.0.1:30000.
Flags are generated from ``ServeConfig``, ``TransferConfig`` (``--transfer-*``) and the engine's
``EngineConfig``: every engine knob once for all workers (``--kv-dtype fp8``,
``--backends-kda fla``, ``--speculative-algorithm mtp``, ...) and again per role to override it
(``--prefill-*``, ``--decode-*``; mixed workers read the decode set). Devices are per instance
(``--prefill-devices``, ``--decode-devices``). Each worker shows what it runs in ``/server_info``.
Supervision (``--supervise-*``: restart limits, backoff, health probes) and the HTTP limits
(``--http-*``: body cap, stream send timeout) are described in docs/serving.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from enum import Enum
from pathlib import Path

from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.engine.config import EngineConfig
from glmlab.extras import import_optional
from glmlab.serve.config import (
    Mode,
    Role,
    ServeConfig,
    TransferConfig,
    engine_config,
    prefill_options,
)
from glmlab.serve.limits import HttpLimits
from glmlab.serve.supervisor import Service, Supervision

HELP = ("serve a checkpoint (default: the tiny preset) as 1P1D behind sglang-router on "
        "127.0.0.1:30000, with NIXL transfers; SGLang /generate and OpenAI /v1 APIs")

ROLES = ("prefill", "decode")
_SERVE_FIELDS = {f.name for f in dataclasses.fields(ServeConfig)}
# the service sets these itself: the device of each instance, and quiet workers. A field whose flag
# would collide with a ServeConfig flag (``--prefill-tp-size``) belongs to the layout, not here.
ENGINE_EXCLUDE = ("device", "print_budget") + tuple(
    f.name for f in dataclasses.fields(EngineConfig)
    if f.name in _SERVE_FIELDS or any(f"{r}_{f.name}" in _SERVE_FIELDS for r in ROLES))


def _engine_dests(prefix: str) -> list[str]:
    """The argparse destinations of the engine flags under ``prefix`` (what cliargs generates)."""
    probe = argparse.ArgumentParser(add_help=False)
    add_dataclass_args(probe, EngineConfig, prefix=prefix, exclude=ENGINE_EXCLUDE)
    return list(vars(probe.parse_args([])))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_args(p, ServeConfig, exclude=("transfer",))
    add_dataclass_args(p, TransferConfig, prefix="transfer-")
    add_dataclass_args(p, Supervision, prefix="supervise-")
    add_dataclass_args(p, HttpLimits, prefix="http-")
    for prefix in ("", *(f"{r}-" for r in ROLES)):
        add_dataclass_args(p, EngineConfig, prefix=prefix, exclude=ENGINE_EXCLUDE)
        # None = not given: a role flag overrides the shared one, which overrides the default
        p.set_defaults(**dict.fromkeys(_engine_dests(prefix)))


def _nested_fields() -> dict[str, set[str]]:
    """EngineConfig fields that are sub-configs (backends, speculative) -> their field names."""
    hints = typing.get_type_hints(EngineConfig)
    out = {}
    for f in dataclasses.fields(EngineConfig):
        tp = next((a for a in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(a)),
                  hints[f.name])
        if dataclasses.is_dataclass(tp):
            out[f.name] = {g.name for g in dataclasses.fields(tp)}
    return out


def engine_options(args: argparse.Namespace, role: str) -> dict:
    """The engine options given for ``role`` (its own flag, else the shared one), by field name
    and as plain JSON values; sub-configs as dicts of their given fields."""
    nested, out = _nested_fields(), {}
    for dest in _engine_dests(""):
        value = getattr(args, f"{role}_{dest}", None)
        if value is None:
            value = getattr(args, dest, None)
        if value is None:
            continue
        value = value.value if isinstance(value, Enum) else value
        head = next((n for n in nested if dest.startswith(n + "_")
                     and dest[len(n) + 1:] in nested[n]), None)
        if head is None:
            out[dest] = value
        else:
            out.setdefault(head, {})[dest[len(head) + 1:]] = value
    return out


def check_options(cfg: ServeConfig, options: dict[Role, dict]) -> None:
    """Every role's engine config builds (a bad value fails before any process starts), and no
    role is asked for what it cannot do."""
    roles = (Role.MIXED,) if cfg.mode is Mode.MIXED else (Role.PREFILL, Role.DECODE)
    if cfg.mode is Mode.PD:  # prefill's drafter learns prompts for decode's (issue 20)
        options[Role.PREFILL] = prefill_options(options.get(Role.PREFILL, {}),
                                                options.get(Role.DECODE, {}))
    for role in roles:
        engine_config(role, options.get(role, {}), "cpu")


def how_to_query(svc: Service) -> str:
    cfg = svc.cfg
    workers = cfg.launched_here()
    # without the router a mixed worker is queried directly; PD requests need the router to pair
    url = svc.url if cfg.launch_router else workers[0].url
    lines = [f"glmlab serve: {svc.served_model_name} ({svc.model_dir}) ready at {url}"
             if cfg.launch_router or cfg.mode is Mode.MIXED else
             f"glmlab serve: {svc.served_model_name} ({svc.model_dir}) workers ready (no router: "
             "a PD request goes to a prefill and a decode worker with one bootstrap_room)",
             f"  service   {url}  (front: /health, /server_info; the rest to sglang-router at "
             f"{svc.router_url}, {'PD' if cfg.mode is Mode.PD else 'regular'} mode, policy "
             f"{cfg.router_policy})" if cfg.launch_router else "  (no router)"]
    for s in workers:
        extra = f"  bootstrap {s.bootstrap_port}" if s.bootstrap_port else ""
        lines.append(f"  {s.name:<9} {s.url}  {s.device}{extra}")
    gen = json.dumps({"text": "Hello, GLM", "sampling_params": {"max_new_tokens": 16,
                                                                "temperature": 0}})
    chat = json.dumps({"model": svc.served_model_name, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "Hello"}]})
    lines.append("Query it:")
    if cfg.launch_router or cfg.mode is Mode.MIXED:
        lines += [f"  curl -s {url}/generate -H 'Content-Type: application/json' -d '{gen}'",
                  f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
                  f"-d '{chat}'"]
    if cfg.launch_router:
        lines.append(f"  curl -s {url}/server_info   (every worker's queues, pools, transfers)")
    lines.append(f"  curl -s {workers[0].url}/server_info   (what a worker runs)")
    if cfg.launch_router:
        lines.append(f"  glmlab bench --port {cfg.port} --dataset-name generated-shared-prefix "
                     f"--gsp-prompts-per-group 16 --max-concurrency 8")
    lines.append(f"Logs: {svc.log_dir}   Ctrl-C stops the service.")
    return "\n".join(lines)


def build_service(args: argparse.Namespace, quiet: bool = False) -> Service:
    cfg = dataclass_from_args(ServeConfig, args,
                              transfer=dataclass_from_args(TransferConfig, args,
                                                           prefix="transfer-"))
    model_dir = resolve_model(cfg.model)
    name = cfg.served_model_name or (cfg.model if not Path(cfg.model).is_dir()
                                     else model_dir.name)
    options = {Role.PREFILL: engine_options(args, "prefill"),
               Role.DECODE: engine_options(args, "decode")}
    options[Role.MIXED] = options[Role.DECODE]
    check_options(cfg, options)
    return Service(cfg, model_dir, name, options, quiet=quiet,
                   supervision=dataclass_from_args(Supervision, args, prefix="supervise-"),
                   limits=dataclass_from_args(HttpLimits, args, prefix="http-"))


def run(args: argparse.Namespace) -> int:
    svc = build_service(args)
    packages = ["fastapi", "uvicorn", "httpx", "prometheus_client"]
    if svc.cfg.launch_router:
        packages.append("sglang_router")  # NOTE: --no-launch-router runs without it (GPU machine)
    for package in packages:
        import_optional(package)  # workers are subprocesses: say what to install before they start
    svc.start()
    print(how_to_query(svc), flush=True)
    return svc.run_forever()
