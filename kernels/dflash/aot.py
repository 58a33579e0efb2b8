"""Ahead-of-time sm_90 compilation of the draft attention kernels at the reference shapes
(G = 4 query heads per KV head, B = 8 block rows, Dh = 128), without a GPU
(``glmlab.kernels.moe.aot.compile_sm90``): the CPU interpreter accepts programs the real compiler
rejects and never allocates registers or shared memory, so this catches both before a GPU run."""

from __future__ import annotations

from glmlab.kernels.dflash import attention_triton as att
from glmlab.kernels.moe.aot import Compiled, arg_types, compile_sm90


def compile_draft_attention(fp8: bool = False, act: str = "bf16") -> list[Compiled]:
    """The split kernel (bf16 or E4M3 draft KV) and the combine kernel, as the launcher runs
    them at G = 4, B = 8 (a 32-row tile), Dh = 128."""
    store = "fp8e4nv" if fp8 else "bf16"
    k = att._split_kernel
    ptr = {a: f"*{act}" for a in ("q_ptr", "kb_ptr", "vb_ptr")}
    ptr |= {"kk_ptr": f"*{store}", "kv_ptr": f"*{store}", "slots_ptr": "*i32", "lens_ptr": "*i32",
            "o_part_ptr": "*fp32", "lse_part_ptr": "*fp32"}
    ptr |= {a: "*fp32" if fp8 else f"*{store}" for a in ("ks_ptr", "vs_ptr")}
    split = compile_sm90(k, arg_types(k, ptr, ("qk_scale",)),
                         dict(G=4, DH=128, BLOCK_M=32, BLOCK_N=att.BLOCK_N, BLOCK_B=16, FP8=fp8,
                              DOT_FP32=False), num_warps=4, num_stages=3)
    k = att._combine_kernel
    ptr = {"o_part_ptr": "*fp32", "lse_part_ptr": "*fp32", "o_ptr": f"*{act}"}
    combine = compile_sm90(k, arg_types(k, ptr), dict(G=4, DH=128, BLOCK_M=32), num_warps=4)
    return [split, combine]
