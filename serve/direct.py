"""The requests sglang-router 0.3.2 refuses or mangles, sent by the front to the workers.

What the router cannot carry (measured against 0.3.2, docs/serving.md): a token-id prompt on
``/v1/completions`` (its ``StringOrArray`` type answers 422), a list of texts on ``/generate``
(422), and the ``/generate`` sampling parameters it drops without a word (``logit_bias``,
``custom_params``, ``structural_tag``, ``seed``). The workers' own API (SGLang's, api.py) takes
all of them, so the front does the router's one job itself, the router's way: one prefill and one
decode worker picked at random among those up, one random 63-bit bootstrap room per sub-request
(prompt x sample: lists when there are several, as the router sends for batches), the prefill's
host and bootstrap port from the layout, the SAME body to both, the decode's answer returned
(streamed or whole, the front passes it through) and the prefill's read and dropped. In mixed
mode the body goes unchanged to a mixed worker. Everything else stays the router's
(``router_cannot_carry`` -> None). Knows the layout and HTTP; not the engine.
"""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp

from glmlab.serve.config import InstanceSpec, Role
from glmlab.serve.schemas import SglSamplingParams

PATHS = ("/generate", "/v1/completions")
DROPPED_SAMPLING = frozenset({"logit_bias", "custom_params", "structural_tag", "seed"})
KNOWN_SAMPLING = frozenset(SglSamplingParams.model_fields)


def router_cannot_carry(path: str, body: dict) -> str | None:
    """Why the router cannot carry ``body`` to ``path`` (then the front sends it), or None."""
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int | list):
            return "a token-id prompt (the router's StringOrArray refuses it)"
    elif path == "/generate":
        if isinstance(body.get("text"), list):
            return "a list of texts (the router refuses it)"
        params = body.get("sampling_params")
        dropped = sorted((DROPPED_SAMPLING | (set(params) - KNOWN_SAMPLING)) & set(params)) \
            if isinstance(params, dict) else []
        if dropped:  # unknown ones too: the worker refuses them by name, the router drops them
            return f"sampling_params the router drops: {', '.join(dropped)}"
    return None


def sub_requests(path: str, body: dict) -> int:
    """Prompts x samples: how many bootstrap rooms the workers expect (schemas.bootstraps)."""
    if path == "/generate":
        text, ids = body.get("text"), body.get("input_ids")
        prompts = len(text) if isinstance(text, list) else \
            len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], list) else 1
        params = body.get("sampling_params")
        n = params.get("n", 1) if isinstance(params, dict) else 1
    else:
        prompt = body.get("prompt")
        prompts = len(prompt) if isinstance(prompt, list) and prompt and \
            not isinstance(prompt[0], int) else 1
        n = body.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    return max(1, prompts) * n  # a bad count is the worker's to refuse, with its own message


def with_bootstrap(path: str, body: dict, prefill: InstanceSpec, rng=random) -> dict:
    """``body`` with the bootstrap fields the router would add for ``prefill``."""
    num = sub_requests(path, body)
    rooms = [rng.getrandbits(63) for _ in range(num)]
    if num == 1:
        boot = {"bootstrap_host": prefill.host, "bootstrap_port": prefill.bootstrap_port,
                "bootstrap_room": rooms[0]}
    else:
        boot = {"bootstrap_host": [prefill.host] * num,
                "bootstrap_port": [prefill.bootstrap_port] * num, "bootstrap_room": rooms}
    return {**body, **boot}


def _pick(front, role: Role) -> InstanceSpec:
    specs = [s for s in front.service.cfg.layout() if s.role is role]
    states = {c.name: c.state for c in front.service.workers()}
    up = [s for s in specs if states.get(s.name, "up") == "up"]
    return random.choice(up or specs)


_draining: set[asyncio.Task] = set()  # the prefills' answers, read and dropped


async def _drain(pending: asyncio.Future) -> None:
    try:
        r = await pending
        try:
            await r.read()
        finally:
            r.release()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        pass  # the decode's answer says what went wrong (it waits on this prefill's room)


async def open_direct(front, request, raw: bytes, headers: dict) -> aiohttp.ClientResponse | None:
    """The decode (or mixed) worker's response to a request the router cannot carry, else None
    (the front then sends it to the router)."""
    if request.method != "POST" or request.path not in PATHS:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None  # malformed: the router answers it like any other
    if not isinstance(body, dict) or router_cannot_carry(request.path, body) is None:
        return None
    headers = {**headers, "Content-Type": "application/json"}
    path = request.rel_url.raw_path_qs
    if front.service.cfg.layout()[0].role is Role.MIXED:
        return await front.session.post(_pick(front, Role.MIXED).url + path, data=raw,
                                        headers=headers)
    prefill, decode = _pick(front, Role.PREFILL), _pick(front, Role.DECODE)
    data = json.dumps(with_bootstrap(request.path, body, prefill)).encode()
    pending = asyncio.ensure_future(front.session.post(prefill.url + path, data=data,
                                                       headers=headers))
    task = asyncio.ensure_future(_drain(pending))
    _draining.add(task)
    task.add_done_callback(_draining.discard)
    return await front.session.post(decode.url + path, data=data, headers=headers)
