"""Prefill/decode disaggregation inside one process: the reference of what ``glmlab.serve`` does
over NIXL, for tests, notebooks and measurements.

A prefill engine runs each prompt and holds its cache after the first token; the decode engine
admits the request as *imported* (its radix tree, in ``kv_only`` mode, shares the cached prefix),
the prompt's missing pages and the request's state are copied across (``ModelCache.copy_from``),
and the decode engine continues from the first token. ``slot_accounting`` uses it to measure the
the reference deployment's claim: N requests sharing Lp tokens, each with Ls of its own, occupy Lp
+ N x Ls token slots
with the kv_only cache instead of N x (Lp + Ls).
"""

from __future__ import annotations

from dataclasses import dataclass

from glmlab.core import SamplingParams, Status, sample_rid
from glmlab.engine.config import EngineConfig, RadixMode
from glmlab.engine.engine import Engine
from glmlab.model.glm import GLM5Model


@dataclass(frozen=True)
class Handoff:
    rid: str  # in the decode engine
    first_token: int
    prefix_len: int  # prompt tokens the decode engine already had
    bytes_moved: int


class LocalPD:
    def __init__(self, prefill: Engine, decode: Engine):
        self.prefill, self.decode = prefill, decode

    def submit(self, prompts: list[list[int]], params: SamplingParams) -> list[Handoff]:
        """Prefill ``prompts`` together, move their caches, and leave them decoding in the decode
        engine. Requests imported together share only what the decode engine had cached before
        (a prompt's pages join its tree when its import completes). ``params.n`` samples of a
        prompt: one prefill, one move, the samples forked on decode (``sample_rid``)."""
        held = [self.prefill.add_request(p, params, hold_after_prefill=True) for p in prompts]
        first: dict[str, int] = {}  # every sample's first token (params.n per prompt)
        while len(first) < len(held) * params.n:
            first.update({o.rid: o.new_token_ids[0] for o in self.prefill.step()})
        for rp in held:
            if self.prefill.request(rp).status is not Status.HELD:
                raise RuntimeError(f"prefill of {rp} ended before the hand-off")
        rids = [self.decode.add_request(p, params, imported=True) for p in prompts]
        targets = self._admitted(rids)
        out = []
        for rp, rd in zip(held, rids, strict=True):
            src, dst = self.prefill.export_target(rp), targets[rd]
            n = len(dst.transfer_pages)
            moved = self.decode.cache.storage.copy_from(
                self.prefill.cache.storage, list(src.pages[len(src.pages) - n:]),
                list(dst.transfer_pages), src.state_slot, dst.state_slot)
            self.prefill.release_held(rp)
            samples = [(first[sample_rid(rp, i)], None) for i in range(1, params.n)]
            self.decode.complete_import(rd, first[rp], samples=samples)
            out.append(Handoff(rd, first[rp], dst.prefix_len, moved))
        return out

    def _admitted(self, rids: list[str]) -> dict:
        found: dict = {}
        for _ in range(10_000):
            found.update({t.rid: t for t in self.decode.import_targets() if t.rid in rids})
            if len(found) == len(rids):
                return found
            self.decode.step()  # admission happens when the decode engine schedules
        raise RuntimeError(f"the decode engine admitted {len(found)} of {len(rids)} requests")


@dataclass(frozen=True)
class SlotAccounting:
    num_requests: int
    prefix_len: int
    suffix_len: int
    page_size: int
    token_slots_shared: int  # measured, kv_only decode cache
    token_slots_unshared: int  # measured, no cache
    hit_rate: float  # prompt tokens served from the tree / prompt tokens (shared run)
    bytes_moved_shared: int
    bytes_moved_unshared: int

    @property
    def expected_shared(self) -> int:
        """Lp + N x Ls, with the prefix in whole pages and each request's rest page-rounded."""
        s = self.page_size
        lp = self.prefix_len // s * s
        own = -(-(self.prefix_len + self.suffix_len) // s) * s - lp
        return lp + self.num_requests * own

    @property
    def expected_unshared(self) -> int:
        s = self.page_size
        return self.num_requests * (-(-(self.prefix_len + self.suffix_len) // s) * s)


def slot_accounting(model: GLM5Model, prefix: list[int], suffixes: list[list[int]],
                    **engine_options) -> SlotAccounting:
    """Import N prompts (``prefix`` + each suffix) into a decode engine with and without the
    kv_only cache; token slots in use once all of them hold their prompt."""
    options = {"print_budget": False, **engine_options}
    params = SamplingParams(max_new_tokens=64, ignore_eos=True)
    prompts = [prefix + s for s in suffixes]
    used, moved, hit = {}, {}, 0.0
    for radix in (RadixMode.KV_ONLY, RadixMode.OFF):
        n = len(suffixes)  # all may run, and all but the first may be in flight at once
        cfg = EngineConfig(radix=radix, max_running_requests=n, extra_slots=n, **options)
        pd = LocalPD(Engine(model, EngineConfig(**options)), Engine(model, cfg))
        # the first request caches the prefix; the rest arrive together and share it
        handoffs = pd.submit(prompts[:1], params) + pd.submit(prompts[1:], params)
        pd.decode.step()  # every request decodes: its first token's KV is in place too
        moved[radix] = sum(h.bytes_moved for h in handoffs)
        used[radix] = pd.decode.cache.usage().token_slots_used
        if radix is RadixMode.KV_ONLY:
            hit = pd.decode.cache.stats.hit_rate
        for h in handoffs:
            pd.decode.abort(h.rid)
    suffix_len = max(len(s) for s in suffixes) + 1  # + the first output token
    # (the first request is one token further; it stays inside that page unless Lp + Ls + 1
    # starts a new one, which the callers' lengths avoid)
    return SlotAccounting(len(suffixes), len(prefix), suffix_len, model_page(options),
                          used[RadixMode.KV_ONLY], used[RadixMode.OFF], hit,
                          moved[RadixMode.KV_ONLY], moved[RadixMode.OFF])


def model_page(options: dict) -> int:
    return options.get("page_size", EngineConfig.page_size)
