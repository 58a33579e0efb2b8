"""On CUDA: speculative greedy decoding stays lossless on the tiny model (fp32), both drafters,
both commit modes, and through the engine."""

from __future__ import annotations

import pytest
import torch

from glmlab.checkpoint import load_model
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.core import SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.speculative.check import lossless_check
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.dflash_io import write_random_draft
from glmlab.testing.parity import prompt_ids

pytestmark = pytest.mark.gpu
PROMPTS = {0: prompt_ids(26, 1), 1: prompt_ids(49, 53), 2: prompt_ids(9, 5)}
PARAMS = SamplingParams(max_new_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def cuda_model():
    return load_model(preset_checkpoint("tiny"), dtype=torch.float32, device="cuda")


def test_session_cycles_are_lossless_on_cuda(cuda_model, tmp_path):
    draft = write_random_draft(cuda_model.cfg, tmp_path / "draft", block_size=8)
    mtp = lossless_check(cuda_model, PROMPTS, PARAMS, SpecConfig(num_steps=7))
    assert mtp.lossless, mtp
    for spec in (SpecConfig(num_steps=5, commit="snapshot"),
                 SpecConfig(algorithm="dflash2", block_size=8, draft_path=str(draft),
                            draft_kv_dtype="fp8")):
        report = lossless_check(cuda_model, PROMPTS, PARAMS, spec, reference=mtp.reference)
        assert report.lossless, report
    oracle = lossless_check(cuda_model, PROMPTS, PARAMS, SpecConfig(num_steps=7),
                            reference=mtp.reference, oracle=True)
    assert oracle.lossless and oracle.mean_commit > 7


def test_engine_verify_phase_on_cuda(cuda_model):
    def run(spec):
        engine = Engine(cuda_model, EngineConfig(device="cuda", context_len=256, max_pages=32,
                                                 cache_bytes=64 << 20, print_budget=False,
                                                 speculative=spec))
        rids = [engine.add_request(p, PARAMS) for p in PROMPTS.values()]
        while engine.has_work:
            engine.step()
        return engine, [engine.request(r).output_ids for r in rids]

    _, plain = run(None)
    engine, spec = run(SpecConfig(num_steps=7))
    assert spec == plain
    engine.cache.check_idle()
    assert engine.spec.held(engine.scheduler.running) == {"rows": 0, "slots": 0, "learned": 0}
