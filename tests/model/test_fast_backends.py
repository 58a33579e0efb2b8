"""The tiny model with every Triton backend (``Backends.triton()``, CPU interpreter, fp32) against
the torch path on the same checkpoint: mixed-length prefill (reference KDA/DSA paths, fused
mHC / norm / router / MoE kernels), decode steps (fused KDA prep + in-place window, paged indexer)
and a uniform 3-token step (the verify shape), with prompts long enough for the indexer to select.

With plain fp32 weights every fused op computes the torch path's maths up to fp32 summation order,
so logits agree to ~1e-5. With block-FP8 weights the triton GEMM also rounds activations to E4M3
(W8A8, as the MoE kernels do), the torch ``linear_fp8`` does not (weight-only dequantisation); a
random tiny MoE amplifies any such difference chaotically (routing flips), so the FP8 case is
checked on the first layer's output.
"""

from __future__ import annotations

import pytest
import torch

from glmlab import presets
from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.kernels.fp8.ref import linear_fp8_ref
from glmlab.model.backends import Backends
from glmlab.model.layers import Linear
from glmlab.model.plan import ForwardPlan
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids

PROMPTS = (5, 23, 18)  # > index_topk (16 tokens) for two of them: the indexer really selects


def _run(model, steps: int = 2) -> list[torch.Tensor]:
    """Prefill three prompts, ``steps`` decode steps, one 3-token step; every step's logits."""
    s = Session(model, num_seqs=len(PROMPTS), max_len=40, page_size=8)
    out = [torch.cat(s.logits({i: prompt_ids(n, 7 + i) for i, n in enumerate(PROMPTS)}))]
    nxt = [int(o[-1].argmax()) for o in s.logits({i: [1] for i in range(len(PROMPTS))})]
    for _ in range(steps):
        logits = s.logits({i: [t] for i, t in enumerate(nxt)})
        out.append(torch.cat(logits))
        nxt = [int(o[-1].argmax()) for o in logits]
    out.append(torch.cat(s.logits({i: [t, 3, 4] for i, t in enumerate(nxt)})))
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _count_fast_paths(monkeypatch) -> dict[str, int]:
    """Count launches of the uniform-step kernels (the test fails if the fast path is skipped)."""
    from glmlab.model import dsa_fast, kda_fast

    calls = {"kda_window": 0, "index_select": 0}
    for mod, name in ((kda_fast, "kda_window"), (dsa_fast, "index_select")):
        real = getattr(mod, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(mod, name, counted)
    return calls


def test_triton_backends_match_torch_on_the_tiny_model(tiny_dir, monkeypatch):
    ref = _run(load_model(tiny_dir, dtype=torch.float32))
    model = load_model(tiny_dir, dtype=torch.float32).use_backends(Backends.triton())
    calls = _count_fast_paths(monkeypatch)
    got = _run(model)
    # 4 uniform steps (3 decode, one of width 3) x 3 KDA layers / 1 DSA layer (+ the MTP is idle)
    assert calls == {"kda_window": 12, "index_select": 4}, calls
    for step, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert _rel(a, b) < 1e-4, (step, _rel(a, b))
        assert torch.equal(a.argmax(-1), b.argmax(-1)), step


@pytest.fixture(scope="module")
def tiny_fp8_dir(tmp_path_factory):
    """The tiny model with 128-wide expert / dense intermediates, written as block-FP8 (so the
    experts can stay E4M3: their gate|up stacking needs whole 128-row blocks)."""
    cfg = presets.tiny(fp8=True)
    cfg["text_config"].update(moe_intermediate_size=128, intermediate_size=256)
    return write_random_checkpoint(cfg, tmp_path_factory.mktemp("tiny-fp8"), seed=3, fp8=True)


def _w8a8_linear(x, linear, residual=None, x_scale=None):
    """The torch path with the GEMM's recipe (activations rounded to E4M3 per 128 channels)."""
    y = linear_fp8_ref(x.reshape(-1, x.shape[-1]), linear.weight, linear.weight_scale_inv,
                       tuple(linear.block)).view(*x.shape[:-1], -1)
    return y if residual is None else y + residual


def _layer_outputs(model, ids) -> list[torch.Tensor]:
    s = Session(model, max_len=40, page_size=8)
    plan = ForwardPlan.build([len(ids)], [0], [0], s.page_table[:1], 8)
    with torch.inference_mode():
        hidden, captured = model(torch.tensor(ids), plan, s.cache, capture_layers=(0, 1))
    return [*captured, model.logits(hidden)]


def test_triton_backends_on_fp8_weights_follow_the_w8a8_recipe(tiny_fp8_dir):
    """Layer 0 holds a KDA layer and a dense block-FP8 MLP (gate|up fused into one FP8 GEMM, the
    fused SwiGLU + quant feeding the down GEMM E4M3 activations). Against the torch path with the
    same W8A8 recipe it differs only where fp32 summation order moves a value across an E4M3
    rounding boundary (~1e-3 after one layer); against the weight-only torch path by the
    activation rounding itself (a few 1e-3 per GEMM)."""
    ids = prompt_ids(23, 8)
    weight_only = _layer_outputs(load_model(tiny_fp8_dir, dtype=torch.float32, fp8="keep"), ids)
    w8a8_model = load_model(tiny_fp8_dir, dtype=torch.float32, fp8="keep")
    for m in w8a8_model.modules():
        if isinstance(m, Linear):
            m.fp8_op = _w8a8_linear
    w8a8 = _layer_outputs(w8a8_model, ids)
    fast_model = load_model(tiny_fp8_dir, dtype=torch.float32, fp8="keep")
    fast_model.use_backends(Backends.triton())
    mlp = fast_model.layers[0].mlp
    assert mlp.gate_up is not None and mlp.gate_up.is_fp8  # the fused FP8 GEMM runs
    fast = _layer_outputs(fast_model, ids)
    assert _rel(fast[0], w8a8[0]) < 1e-2, _rel(fast[0], w8a8[0])
    assert _rel(fast[0], w8a8[0]) < 0.5 * _rel(fast[0], weight_only[0])
    assert 1e-4 < _rel(fast[0], weight_only[0]) < 5e-2


def test_speculative_verify_on_triton_backends_is_lossless(tiny_dir):
    """MTP drafts verified in uniform windows on the fused paths (REPLAY: the recorder takes the
    recurrence inputs, the in-place window kernel runs without storing the state, the indexer
    rows are recorded batched) emit exactly the torch path's plain greedy tokens."""
    from glmlab.core import SamplingParams
    from glmlab.speculative.cycle import SpecDecoder
    from glmlab.speculative.layout import SessionLayout
    from glmlab.speculative.mtp import MTPDrafter

    prompts = {0: list(range(40, 62)), 1: list(range(100, 109))}
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    plain = Session(load_model(tiny_dir, dtype=torch.float32), len(prompts), 48)
    ref = {r: plain.generate(r, p, params) for r, p in prompts.items()}
    model = load_model(tiny_dir, dtype=torch.float32).use_backends(Backends.triton())
    session = Session(model, len(prompts), 48)
    layout = SessionLayout(session)
    dec = SpecDecoder(model, layout, MTPDrafter(model, layout, 3), "replay")
    assert dec.generate(prompts, params) == ref
