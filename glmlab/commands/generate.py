"""glmlab generate: run a prompt through a checkpoint (via the engine); print the continuation."""

from __future__ import annotations

import argparse
import json
import sys

from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.cliargs import add_dataclass_args, dataclass_from_args, optional_dataclass_from_args
from glmlab.core import SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.llm import LLM
from glmlab.model.backends import Backends
from glmlab.speculative.config import SpecConfig
from glmlab.tokenizer import Tokenizer

HELP = "generate a continuation (greedy by default) from --prompt or --prompt-ids"
_ENGINE_EXCLUDE = ("device", "dtype", "seed", "print_budget")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory, or the preset 'tiny'")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text prompt")
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--json", action="store_true", help='print {"output_ids": [...], "text": "..."}')
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="fp32")
    p.add_argument("--device", default="cpu")
    add_dataclass_args(p, SamplingParams, exclude=("stop",), defaults={"max_new_tokens": 32})
    add_dataclass_args(p, EngineConfig, exclude=_ENGINE_EXCLUDE,
                       defaults={"print_budget": False})
    # short form of --speculative-algorithm; sizes: --speculative-num-steps / -block-size, ...
    p.add_argument("--speculative", dest="speculative_algorithm", choices=("mtp", "dflash2"),
                   help="speculative decoding: MTP chain or DFlash2 block drafting")


def _prompt_ids(args) -> list[int] | str:
    if args.prompt is not None:
        return args.prompt
    try:
        return [int(x) for x in args.prompt_ids.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got "
                         f"{args.prompt_ids!r}") from None


def run(args: argparse.Namespace) -> int:
    params = dataclass_from_args(SamplingParams, args)
    engine = {f: getattr(args, f) for f in EngineConfig.__dataclass_fields__
              if f not in _ENGINE_EXCLUDE and hasattr(args, f)}
    engine["backends"] = dataclass_from_args(Backends, args, prefix="backends-")
    engine["speculative"] = optional_dataclass_from_args(SpecConfig, args, "speculative-")
    path = resolve_model(args.model)
    if args.prompt_ids is not None and Tokenizer.from_dir_optional(path) is None:
        return _ids_only(args, engine, _prompt_ids(args), params)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, print_budget=False, **engine)
    prompt = _prompt_ids(args)
    if not prompt:
        raise ValueError("the prompt is empty")
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    spec = llm.engine.spec.summary() if llm.engine.spec else None
    if args.json:
        extra = {"speculative": spec} if spec else {}
        if spec:  # the stable interface: cycles and mean tokens committed per cycle (measured)
            extra["spec"] = {"cycles": spec["cycles"], "accepted_per_cycle": spec.get(
                "accept_len", 0.0)}
        print(json.dumps({"output_ids": out.output_ids, "text": out.text, **extra}))
    else:
        print(out.text)
        if spec and spec["cycles"]:
            sim = " [simulated acceptance]" if spec["simulated"] else ""
            print(f"speculative{sim}: {spec['cycles']} cycles, acceptance length "
                  f"{spec['accept_len']:.2f}, {spec['ms_per_accepted_token']:.2f} ms per "
                  "accepted token", file=sys.stderr)
    return 0


def _ids_only(args: argparse.Namespace, engine: dict, prompt: list[int], params) -> int:
    """A checkpoint without tokenizer.json (e.g. a bare ``save_pretrained``): ids in, ids out
    through the engine itself; the JSON ``text`` is null."""
    if not prompt:
        raise ValueError("the prompt is empty")
    eng = Engine.from_pretrained(args.model, EngineConfig(device=args.device, dtype=args.dtype,
                                                          print_budget=False, **engine))
    rid = eng.add_request(prompt, params)
    while not any(o.rid == rid and o.finished for o in eng.step()):
        pass
    ids = list(eng.request(rid).output_ids)
    print(json.dumps({"output_ids": ids, "text": None}) if args.json else ",".join(map(str, ids)))
    return 0
