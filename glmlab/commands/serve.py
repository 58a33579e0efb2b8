"""glmlab serve: the prefill/decode-disaggregated service behind sglang-router (or mixed workers).

With no arguments: the tiny checkpoint (written once into the cache directory), one prefill and
one decode worker on the CPU, NIXL over UCX TCP between them, sglang-router on 127.0.0.1:30000.
Flags are generated from ``ServeConfig`` and ``TransferConfig`` (``--transfer-*``) and, per role,
from the engine's config (``--prefill-*``, ``--decode-*``; mixed workers read the decode set).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.engine.config import EngineConfig
from glmlab.serve.config import Mode, Role, ServeConfig, TransferConfig
from glmlab.serve.supervisor import Service

HELP = ("serve a checkpoint (default: the tiny preset) as 1P1D behind sglang-router on "
        "127.0.0.1:30000, with NIXL transfers; SGLang /generate and OpenAI /v1 APIs")

# engine fields that the service sets itself (device per instance) or does not offer yet: workers
# run the torch ops, and PD decode does not speculate (draft state is not shipped over NIXL)
_ENGINE_EXCLUDE = ("device", "backends", "print_budget", "speculative")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dataclass_args(p, ServeConfig, exclude=("transfer",))
    add_dataclass_args(p, TransferConfig, prefix="transfer-")
    for role in ("prefill", "decode"):
        add_dataclass_args(p, EngineConfig, prefix=f"{role}-", exclude=_ENGINE_EXCLUDE)


def engine_options(args: argparse.Namespace, role: str) -> dict:
    """The role's engine flags that differ from EngineConfig's defaults, as plain JSON values."""
    out, defaults = {}, EngineConfig()
    for f in dataclasses.fields(EngineConfig):
        dest = f"{role}_{f.name}"
        if f.name in _ENGINE_EXCLUDE or not hasattr(args, dest):
            continue
        value, default = getattr(args, dest), getattr(defaults, f.name)
        default = getattr(default, "value", default)
        if value != default:
            out[f.name] = value
    EngineConfig(**out)  # a bad value fails here, before any process starts
    return out


def how_to_query(svc: Service) -> str:
    cfg, url = svc.cfg, svc.url
    lines = [f"glmlab serve: {svc.served_model_name} ({svc.model_dir}) ready at {url}",
             f"  router    {url}  (sglang-router, {'PD' if cfg.mode is Mode.PD else 'regular'} "
             f"mode, policy {cfg.router_policy})" if cfg.launch_router else "  (no router)"]
    for s in cfg.launched_here():
        extra = f"  bootstrap {s.bootstrap_port}" if s.bootstrap_port else ""
        lines.append(f"  {s.name:<9} {s.url}  {s.device}{extra}")
    gen = json.dumps({"text": "Hello, GLM", "sampling_params": {"max_new_tokens": 16,
                                                                "temperature": 0}})
    chat = json.dumps({"model": svc.served_model_name, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "Hello"}]})
    lines += ["Query it:",
              f"  curl -s {url}/generate -H 'Content-Type: application/json' -d '{gen}'",
              f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
              f"-d '{chat}'",
              f"  glmlab bench --port {cfg.port} --dataset-name generated-shared-prefix "
              f"--gsp-prompts-per-group 16 --max-concurrency 8",
              f"Logs: {svc.log_dir}   Ctrl-C stops the service."]
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
    return Service(cfg, model_dir, name, options, quiet=quiet)


def run(args: argparse.Namespace) -> int:
    svc = build_service(args)
    svc.start()
    print(how_to_query(svc), flush=True)
    return svc.run_forever()
