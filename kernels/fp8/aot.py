"""Ahead-of-time compilation of the block-FP8 dense GEMM for Hopper (sm_90) without a GPU.

Drives ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` through ``glmlab.kernels.moe.aot``,
so CI can check that each program shape of ``gemm_triton._linear_fp8_kernel`` compiles for H200,
runs its E4M3 dots on ``wgmma`` and fits in shared memory, and that the CUDA-core GEMV
(``gemv_triton._gemv_fp8_kernel``, configs of kind ``gemv``) compiles too. Knows nothing about
choosing tiles.
"""

from __future__ import annotations

from glmlab.kernels.fp8 import gemm_triton
from glmlab.kernels.fp8.gemm_configs import GemmConfig
from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX
from glmlab.kernels.moe.aot import Compiled, compile_sm90


def compile_linear_fp8(cfg: GemmConfig, act: str = "bf16", residual: bool = False) -> Compiled:
    """The kernel ``linear_fp8`` launches for ``cfg`` (the tensor-core GEMM, or the GEMV for a
    ``gemv`` config) with ``act`` activations (bf16 x quantised in the prologue when
    ``cfg.fuse_quant``, else E4M3 x with scales)."""
    a = act if cfg.fuse_quant else "fp8e4nv"
    types = {"a_ptr": f"*{a}", "a_scale_ptr": "*fp32" if not cfg.fuse_quant else f"*{act}",
             "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32", "c_ptr": f"*{act}",
             "res_ptr": f"*{act}", "ws_ptr": "*fp32" if cfg.split_k > 1 else f"*{act}",
             "ticket_ptr": "*i32" if cfg.split_k > 1 else f"*{act}"}
    types |= dict.fromkeys(["M", "N", "K", "stride_am", "stride_asm", "stride_bn", "stride_bsn",
                            "stride_cm", "stride_rm"], "i32")
    constexprs = dict(A_FP8=not cfg.fuse_quant, HAS_RES=residual, SPLIT_K=cfg.split_k,
                      SCALE_BY_RECIPROCAL=True, FP8_MAX_C=448.0, INV_FP8_MAX_C=INV_FP8_MAX,
                      BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_N=128)
    if cfg.kind == "gemv":
        from glmlab.kernels.fp8 import gemv_triton

        kernel, constexprs = gemv_triton._gemv_fp8_kernel, {**constexprs, "GROUP_K": 128}
    else:
        kernel, constexprs = gemm_triton._linear_fp8_kernel, {**constexprs,
                                                              "SWAP_AB": cfg.swap_ab}
    return compile_sm90(kernel, types, constexprs, cfg.num_warps, cfg.num_stages)
