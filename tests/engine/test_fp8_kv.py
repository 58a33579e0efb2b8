"""FP8 KV (528-B scaled latent rows + FP8 pooled keys) against BF16 KV on the tiny model.

Documented tolerance: teacher-forced top-1 agreement >= 0.90 (each position predicted under the
BF16-KV greedy tokens). Measured with ``python -m glmlab.bench.engine --preset tiny --agreement
--num-prompts 32 --input-len 96 --output-len 32``: 0.963 (BF16 vs fp32 KV: 0.999); free-running
outputs diverge sooner (identical 25% at 32 tokens) because the random tiny model's top-2 logit
margins are small and every flip compounds. The engine's FP8 path itself must add nothing: its
outputs equal the model's own greedy loop over the same FP8 cache.
"""

from __future__ import annotations

import torch

from glmlab.bench.engine import kv_agreement
from glmlab.cache.storage import CacheDtypes
from glmlab.core import SamplingParams
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids

FP8 = torch.float8_e4m3fn
TOLERANCE = 0.90


def _kv(dtype):
    return CacheDtypes(latent=dtype, pool_keys=dtype, conv=torch.float32, tail=torch.float32)


def test_fp8_kv_teacher_forced_agreement(tiny_model):
    prompts = [prompt_ids(n, 300 + n) for n in (20, 45, 70, 96, 120, 33)]
    row = kv_agreement(tiny_model, prompts, 16, _kv(FP8), _kv(torch.bfloat16))
    print(row)
    assert row["teacher_forced_top1"] >= TOLERANCE, row


def test_engine_fp8_path_equals_the_model_over_the_same_cache(tiny_model, make_engine, run):
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    prompts = [prompt_ids(n, n + 1) for n in (9, 40, 77)]
    engine = make_engine(kv_dtype="fp8", index_dtype="fp8", chunk_size=64,
                         max_prefill_tokens=64)
    assert engine.cache.storage.latent_fp8 is not None and engine.cache.storage.keys_fp8
    outs = run(engine, [(p, params) for p in prompts])
    dtypes = engine.cache.storage.dtypes
    assert outs == [Session(tiny_model, max_len=96, dtypes=dtypes).generate(0, p, params)
                    for p in prompts]
    engine.cache.check_idle()
