"""A request's tokens do not depend on what ran before it in the same engine.

On the H200, ``glmlab serve`` (which had served a 37-token prompt first) and a fresh ``glmlab
generate`` agreed on a 300-token prompt's first 8 greedy tokens and then parted, in mixed and PD
mode alike, while two fresh ``generate`` processes agreed with each other. That is the signature
of state one request leaves behind (a reused page or state slot, a buffer of the CUDA graphs)
leaking into the next. Here one engine serves prompt A, then prompt B, against a fresh engine
serving B alone, with logits compared step by step: on the CPU over the torch reference ops, and
on a GPU over the fast path (fla / TileLang / Triton kernels and CUDA graphs), page size 64 as
the service runs it.
"""

from __future__ import annotations

import pytest
import torch

from glmlab.core import SamplingParams
from glmlab.engine.llm import LLM
from glmlab.model.backends import Backends
from glmlab.testing.parity import prompt_ids

GPU = torch.cuda.is_available()


def _engine(tiny_dir) -> LLM:
    opts = dict(device="cuda", dtype="bf16", backends=Backends.fast(), cuda_graph_max_bs=8,
                cache_bytes=256 << 20) if GPU else dict(dtype="fp32")
    return LLM(tiny_dir, page_size=64, print_budget=False, **opts)


@pytest.mark.parametrize("first,second", [(37, 300), (120, 70)])
def test_a_previous_request_leaves_nothing_behind(tiny_dir, first, second):
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=2)
    fresh = _engine(tiny_dir).generate([prompt_ids(second, second)], params, use_tqdm=False)[0]
    llm = _engine(tiny_dir)
    llm.generate([prompt_ids(first, first)], params, use_tqdm=False)
    after = llm.generate([prompt_ids(second, second)], params, use_tqdm=False)[0]
    assert after.output_ids == fresh.output_ids
    # the same numbers, not just the same argmax: every step's logprobs of the chosen tokens
    lp = [torch.tensor([t.logprob for t in c.logprobs]) for c in (fresh, after)]
    assert torch.allclose(lp[0], lp[1], atol=1e-5 if not GPU else 1e-3)
