"""``GLM5Model.logits`` on a strided batch of rows runs one GEMM (not a batched one that reads the
lm_head once per batch row, which torch's matmul does for such an input)."""

from __future__ import annotations

import torch

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import preset_checkpoint


def test_strided_rows_take_one_gemm_and_give_the_rows_logits():
    model = load_model(preset_checkpoint("tiny"), dtype=torch.float32)
    hidden = torch.randn(5, 8, model.cfg.hidden_size)
    drafted = hidden[:, 1:]  # what the DFlash2 drafter hands over: not viewable as 2-D
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = model.logits(drafted)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::bmm" not in ops
    assert got.shape == (5, 7, model.cfg.vocab_size) and got.dtype == torch.float32
    want = torch.stack([model.logits(drafted[i].contiguous()) for i in range(5)])
    torch.testing.assert_close(got, want)


def test_zero_rows_give_zero_logit_rows():
    model = load_model(preset_checkpoint("tiny"), dtype=torch.float32)
    got = model.logits(torch.empty(0, model.cfg.hidden_size))
    assert got.shape == (0, model.cfg.vocab_size)
    assert model.logits(torch.empty(2, 0, model.cfg.hidden_size)).shape == (2, 0,
                                                                            model.cfg.vocab_size)
