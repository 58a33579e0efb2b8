"""PD + speculation inside one process: a prefill engine whose drafter learns the prompt, the rows
the PD transfer would WRITE (``kvplan.row_copies`` over the cache's and the drafter's regions)
copied into a decode engine, which then speculates from its first decode step.

The reference is a mixed engine with the same settings: the decode engine must propose the same
drafts at every cycle (so it holds the drafter state the mixed engine has after its prefill) and
commit as many tokens per cycle, its tokens must equal plain greedy decoding, and both engines'
pools must end empty. Without the drafter rows the decode engine would decode plainly (no cycles
at all); with stale ones its drafts would differ."""

from __future__ import annotations

import pytest
import torch

from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.config import ModelConfig
from glmlab.core import SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.model_runner import load_model_for
from glmlab.serve.bootstrap import RoomMessage
from glmlab.serve.kvplan import AUX, checked_regions, row_copies
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.dflash_io import write_random_draft

PAGE = 16
BASE = dict(page_size=PAGE, chunk_size=32, cache_bytes=8 << 20, print_budget=False)
PROMPT = [(i * 37 + 11) % 250 for i in range(37)]  # 3 pages, the last one partial
NEW = 7


@pytest.fixture(scope="module")
def tiny():
    path = preset_checkpoint("tiny")
    return path, load_model_for(path, EngineConfig(**BASE))


@pytest.fixture(scope="module")
def draft_dir(tiny, tmp_path_factory):
    return str(write_random_draft(ModelConfig.from_hf(tiny[0]),
                                  tmp_path_factory.mktemp("draft"), block_size=4))


def _record_drafts(engine: Engine) -> list:
    """Every proposal the engine's drafter makes, as token lists, in order."""
    drafter, seen = engine.spec.decoder.drafter, []
    inner = drafter.propose

    def propose(reqs):
        proposal = inner(reqs)
        seen.append(proposal.tokens.tolist())
        return proposal

    drafter.propose = propose
    return seen


def _regions(engine: Engine):
    return checked_regions({**engine.cache.storage.regions(), **engine.spec.handoff.regions()})


def _pd_run(model, spec: SpecConfig, prompt: list[int]) -> tuple[list[int], list, Engine, Engine]:
    params = SamplingParams(max_new_tokens=NEW, temperature=0, ignore_eos=True)
    prefill = Engine(model, EngineConfig(**BASE, speculative=spec, radix="kv_and_state"))
    decode = Engine(model, EngineConfig(**BASE, speculative=spec, radix="kv_only"))
    drafts = _record_drafts(decode)
    rp = prefill.add_request(prompt, params, hold_after_prefill=True)
    first = None
    while first is None:
        first = next((o.new_token_ids[0] for o in prefill.step() if o.rid == rp), None)
    rd = decode.add_request(prompt, params, imported=True)
    while not decode.import_targets():
        decode.step()
    dst, src = decode.import_targets()[0], prefill.export_target(rp)
    msg = RoomMessage(0, "decode", len(prompt), "", dst.prefix_len, tuple(dst.transfer_pages),
                      dst.state_slot, (dst.state_slot,))
    theirs, mine = _regions(prefill), _regions(decode)
    assert {n: (t.shape[1:], u) for n, (t, u) in theirs.items()} == \
        {n: (t.shape[1:], u) for n, (t, u) in mine.items()}  # rows alike, pools sized apart
    kpool = model.cfg.dsa.index_kpool
    for c in row_copies(theirs, PAGE, kpool, list(src.pages), src.state_slot, [0], msg):
        if c.region != AUX:
            mine[c.region][0][c.dst:c.dst + c.count] = theirs[c.region][0][c.src:c.src + c.count]
    prefill.release_held(rp)
    out = [first]
    out += decode.complete_import(rd, first, draft_state=True)[0].new_token_ids[1:]
    while decode.has_work:
        out += [t for o in decode.step() for t in o.new_token_ids]
    return out, ([s.commit_lens for s in decode.spec.stats], drafts), prefill, decode


def _mixed_run(model, spec: SpecConfig | None, prompt: list[int]) -> tuple[list[int], list]:
    engine = Engine(model, EngineConfig(**BASE, speculative=spec))
    drafts = _record_drafts(engine) if spec else []
    params = SamplingParams(max_new_tokens=NEW, temperature=0, ignore_eos=True)
    rid = engine.add_request(prompt, params)
    out = []
    while engine.has_work:
        out += [t for o in engine.step() if o.rid == rid for t in o.new_token_ids]
    engine.assert_idle()
    return out, ([s.commit_lens for s in engine.spec.stats] if spec else [], drafts)


_PLAIN: dict = {}


def plain_greedy(model) -> list[int]:
    if "out" not in _PLAIN:
        _PLAIN["out"] = _mixed_run(model, None, PROMPT)[0]
    return _PLAIN["out"]


@pytest.mark.parametrize("algorithm", ["mtp", "dflash2"])
def test_pd_decode_speculates_from_the_first_step_like_mixed(tiny, draft_dir, algorithm):
    _, model = tiny
    spec = (SpecConfig("mtp", num_steps=2) if algorithm == "mtp"
            else SpecConfig("dflash2", block_size=4, draft_path=draft_dir))
    mixed, (mixed_cycles, mixed_drafts) = _mixed_run(model, spec, PROMPT)
    pd, (pd_cycles, pd_drafts), prefill, decode = _pd_run(model, spec, PROMPT)
    assert pd == mixed == plain_greedy(model)
    assert pd_cycles and pd_cycles == mixed_cycles
    assert pd_drafts == mixed_drafts  # the same drafts every cycle: the state arrived whole
    assert decode.spec.totals["cycles"] == len(mixed_cycles)
    assert decode.spec.accept_length == pytest.approx(
        sum(map(sum, mixed_cycles)) / sum(map(len, mixed_cycles)))
    prefill.assert_idle()
    decode.assert_idle()


def test_handoff_regions_name_what_each_drafter_needs(tiny, draft_dir):
    _, model = tiny
    mtp = Engine(model, EngineConfig(**BASE, speculative=SpecConfig("mtp", num_steps=2)))
    regions = mtp.spec.handoff.regions()
    assert {n: u for n, (_, u) in regions.items()} == {"mtp.hidden": "state", "mtp.first": "state"}
    slots = mtp.cache.storage.num_state_slots
    assert regions["mtp.hidden"][0].shape == (slots, model.cfg.hidden_size)
    fp8 = Engine(model, EngineConfig(**BASE, speculative=SpecConfig(
        "dflash2", block_size=4, draft_path=draft_dir, draft_kv_dtype="fp8")))
    names = fp8.spec.handoff.regions()
    layers = fp8.spec.decoder.drafter.draft.cfg.num_layers
    assert sorted(names) == sorted(f"draft.{kind}.{i}" for i in range(layers)
                                   for kind in ("k", "v", "k_scale", "v_scale"))
    assert all(unit == "token" and t.shape[0] == fp8.cache.storage.num_token_slots
               for t, unit in names.values())
    assert mtp.spec.handoff.describe() != fp8.spec.handoff.describe()
    assert torch.float8_e4m3fn in {t.dtype for t, _ in names.values()}
