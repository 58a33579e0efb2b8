"""Which implementation runs each hot op: chosen once, by name, when a model is prepared.

Every op has a ``torch`` reference (the specification, runs anywhere). A fast backend (Triton,
TileLang, fla) is registered here by *import path*, so nothing is imported or probed until a
config asks for it, and it may be registered only together with a test comparing it to the
reference. ``GLM5Model.use_backends`` resolves the names once and records them.

Op signatures (shape letters as in kernels/README.md):
  kda_prefill(q, k, v, g, beta, states, cu_seqlens) -> (o, states)
      q, k [T, H, K] (normalised, q scaled), v [T, H, V], g [T, H, K] fp32, beta [T, H],
      states [N, H, K, V] fp32 initial states, cu_seqlens [N+1]; returns o [T, H, V], final states.
  kda_decode(q, k, v, g, beta, states) -> (o, states)     one token per sequence: [N, H, *]
  sparse_mla(q, cache, layer, slot_indices, scale) -> [T, H, R] fp32
      q [T, H, R] absorbed queries; slot_indices [T, W] token slots into the layer's latent cache.
  moe_experts(x, ids, weights, experts) -> [T, D]        routed experts only (no shared expert)
  linear_fp8(x, linear, residual=None, x_scale=None) -> [T, N]   a Linear with block-FP8 weights
      (torch: dequantise + matmul; triton: the block-FP8 GEMM, activations quantised per token
      per 128 channels); ``residual`` is added after the product is rounded.
  rmsnorm(x, norm, residual=None) -> (h, s)       s = x (+ residual), h = norm(s)
  mhc -> an object with three methods (one mHC site, docs/model.md section 2.2):
      mix(x, hc, pending) -> (x', pre, post, comb)   the pending (y, post, comb) write-back of the
          previous site applied to the streams x [T, N, D] (if any), then hc's coefficients of x';
      collapse_norm(x, pre, norm) -> h [T, D]         norm(sum_i pre_i x_i);
      expand(x, pending) -> x'                        the write-back alone (the last site).
  router(h, router) -> (weights [T, A] fp32, ids [T, A])
  kda_step(layer, h, plan, cache) -> [T, P]   a KDA layer between its input and o_proj
      (torch: the layer's per-sequence path; triton: fused prep + in-place window + gated norm
      on uniform steps (decode, verify), the torch path otherwise)
  dsa_index(layer, h, q_lat, plan, cache) -> [T, W]   token slots each query attends to, -1 padded
      (torch: per-sequence pool update + selection; triton: the paged indexer on uniform steps)
  penalties(x, idx, rows, counts, prompt, bias, stops, rep, freq, pres, early) -> None
      the sampler's logit adjustments, in place on rows ``idx`` of fp32 logits [N, V]
  token_mask(x, idx, bitmask) -> None    a grammar's allowed tokens ([M, ceil(V/32)] int32 bits)
  race(x, idx, temperature, seeds, positions) -> [M] int64    the seeded draw of rows ``idx``
  logprobs(logits, tokens, top) -> [N, 1 + 2 * top]   the sampled tokens' log-softmax, the top
      alternatives' values and ids (torch: glmlab.sampling.logprob_table; triton: one read)
      (all glmlab.kernels.sampling: torch references; triton: one pass each) - bound by the
      ModelRunner's sampler, not the model (``Backends.sampling``)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from glmlab.extras import import_optional


class Registry:
    def __init__(self, op: str):
        self.op = op
        self._impls: dict[str, Callable | str] = {}

    def add(self, name: str, impl: Callable | str) -> None:
        """Register ``impl``: a callable, or ``"package.module:function"`` imported on first use."""
        self._impls[name] = impl

    def get(self, name: str) -> Callable:
        if name not in self._impls:
            raise ValueError(f"no {self.op} backend {name!r}; registered: {sorted(self._impls)}")
        impl = self._impls[name]
        if isinstance(impl, str):
            module, _, attr = impl.partition(":")
            impl = getattr(import_optional(module), attr)  # missing extra -> pip hint
            self._impls[name] = impl
        return impl

    def names(self) -> list[str]:
        return sorted(self._impls)


KDA_PREFILL = Registry("kda_prefill")
KDA_DECODE = Registry("kda_decode")
SPARSE_MLA = Registry("sparse_mla")
MOE_EXPERTS = Registry("moe_experts")

KDA_PREFILL.add("torch", "glmlab.model.torch_ops:kda_prefill")
KDA_DECODE.add("torch", "glmlab.model.torch_ops:kda_decode")
SPARSE_MLA.add("torch", "glmlab.model.torch_ops:sparse_mla")
SPARSE_MLA.add("tilelang", "glmlab.kernels.dsa.sparse_mla_tilelang:sparse_mla")
MOE_EXPERTS.add("torch", "glmlab.model.torch_ops:moe_experts")
KDA_PREFILL.add("fla", "glmlab.kernels.kda.fla_backend:kda_prefill_fla")
KDA_DECODE.add("fla", "glmlab.kernels.kda.fla_backend:kda_decode_fla")
MOE_EXPERTS.add("triton", "glmlab.kernels.moe.fused_moe:moe_experts_triton")

LINEAR_FP8 = Registry("linear_fp8")
RMSNORM = Registry("rmsnorm")
MHC = Registry("mhc")
ROUTER = Registry("router")
KDA_STEP = Registry("kda_step")
DSA_INDEX = Registry("dsa_index")
PENALTIES = Registry("penalties")
TOKEN_MASK = Registry("token_mask")
RACE = Registry("race")
RACE.add("torch", "glmlab.kernels.sampling.ref:race_ref")
RACE.add("triton", "glmlab.kernels.sampling.race_triton:race_triton")
LOGPROBS = Registry("logprobs")
# torch: the engine's own table (its two-stage top-k), not the kernel's plain-topk reference
LOGPROBS.add("torch", "glmlab.sampling:logprob_table")
LOGPROBS.add("triton", "glmlab.kernels.sampling.logprobs_triton:logprob_table_triton")
for _reg, _name in ((PENALTIES, "penalties"), (TOKEN_MASK, "token_mask")):
    _reg.add("torch", f"glmlab.kernels.sampling.ref:apply_{_name}_ref")
    _reg.add("triton", f"glmlab.kernels.sampling.penalties_triton:apply_{_name}_triton")
for _reg, _name in ((LINEAR_FP8, "linear_fp8"), (RMSNORM, "rmsnorm"), (MHC, "mhc"),
                    (ROUTER, "router"), (KDA_STEP, "kda_step"), (DSA_INDEX, "dsa_index")):
    _reg.add("torch", f"glmlab.model.torch_ops:{_name}")
    _reg.add("triton", f"glmlab.model.fast_ops:{_name}")


@dataclass(frozen=True)
class Backends:
    kda: str = "torch"
    sparse_mla: str = "torch"
    moe: str = "torch"
    linear_fp8: str = "torch"
    norm: str = "torch"
    mhc: str = "torch"
    router: str = "torch"
    kda_step: str = "torch"
    dsa_index: str = "torch"
    sampling: str = "torch"  # the sampler's penalties, grammar masks, race and logprobs

    @classmethod
    def fast(cls) -> Backends:
        """Every op on its GPU kernel: what a decode step without host overhead runs."""
        return cls(kda="fla", sparse_mla="tilelang", moe="triton", linear_fp8="triton",
                   norm="triton", mhc="triton", router="triton", kda_step="triton",
                   dsa_index="triton", sampling="triton")

    @classmethod
    def triton(cls) -> Backends:
        """Every op that has a Triton kernel on it, the rest on torch: what the CPU interpreter
        can run (tests)."""
        return cls(moe="triton", linear_fp8="triton", norm="triton", mhc="triton",
                   router="triton", kda_step="triton", dsa_index="triton", sampling="triton")

    def resolve(self) -> dict[str, Callable]:
        return {
            "kda_prefill": KDA_PREFILL.get(self.kda),
            "kda_decode": KDA_DECODE.get(self.kda),
            "sparse_mla": SPARSE_MLA.get(self.sparse_mla),
            "moe_experts": MOE_EXPERTS.get(self.moe),
            "linear_fp8": LINEAR_FP8.get(self.linear_fp8),
            "rmsnorm": RMSNORM.get(self.norm),
            "mhc": MHC.get(self.mhc),
            "router": ROUTER.get(self.router),
            "kda_step": KDA_STEP.get(self.kda_step),
            "dsa_index": DSA_INDEX.get(self.dsa_index),
            "penalties": PENALTIES.get(self.sampling),
            "token_mask": TOKEN_MASK.get(self.sampling),
            "race": RACE.get(self.sampling),
            "logprobs": LOGPROBS.get(self.sampling),
        }

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
