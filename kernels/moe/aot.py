"""Ahead-of-time compilation of the MoE Triton kernels for Hopper (sm_90) without a GPU.

CPU machines run the kernels only under the interpreter, which skips the real compiler. This
module drives ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` (docs/platform.md section
2.1), so CI can check that every kernel and every config of a search space compiles for H200,
uses ``wgmma`` for the FP8 dots and fits in shared memory, without a device. It works whether or not
``TRITON_INTERPRET`` is set (it recompiles from the Python source). It knows nothing about tuning.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from glmlab.kernels.fp8 import quant_triton
from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX
from glmlab.kernels.moe import act_triton, gemm_triton, routing_triton
from glmlab.kernels.moe.configs import KernelConfig

SM90 = GPUTarget("cuda", 90, 32)
SM90_SMEM_LIMIT = 232448  # bytes of shared memory per block on H100/H200 (227 KiB)


@dataclass(frozen=True)
class Compiled:
    name: str
    ptx: str
    shared: int
    num_warps: int
    cubin: bytes = b""

    @property
    def uses_wgmma(self) -> bool:
        return "wgmma" in self.ptx


def _jit(kernel):
    """The compiler-facing JITFunction, also when the interpreter wrapped the kernel."""
    fn = getattr(kernel, "fn", kernel)
    if isinstance(fn, triton.runtime.JITFunction):
        return fn
    return triton.runtime.JITFunction(fn)


def arg_types(kernel, ptrs: dict[str, str], floats: tuple[str, ...] = ()) -> dict[str, str]:
    """``compile_sm90``'s types for ``kernel``: the pointers named in ``ptrs``, every other
    argument an i32 unless named in ``floats`` (fp32)."""
    return {a: ptrs.get(a, "fp32" if a in floats else "i32") for a in _jit(kernel).arg_names}


def compile_sm90(kernel, types: dict[str, str], constexprs: dict, num_warps: int = 4,
                 num_stages: int = 3) -> Compiled:
    """Compile ``kernel`` with argument ``types`` (e.g. ``"*fp8e4nv"``, ``"i32"``) and constexprs.

    Pointer and int arguments are declared 16-divisible, as Triton specialises them at launch.
    """
    fn = _jit(kernel)
    signature = {name: ("constexpr" if name in constexprs else types[name])
                 for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in constexprs and (types[name].startswith("*") or types[name] == "i32")
             and name not in fn_no_specialize(fn)}
    src = ASTSource(fn, signature, {k: tl.constexpr(v) for k, v in constexprs.items()}, attrs)
    out = triton.compile(src, target=SM90, options={"num_warps": num_warps,
                                                     "num_stages": num_stages})
    return Compiled(fn.__name__, out.asm["ptx"], out.metadata.shared, num_warps,
                    out.asm.get("cubin", b""))


def fn_no_specialize(fn) -> set[str]:
    return {fn.arg_names[i] if isinstance(i, int) else i for i in fn.do_not_specialize}


def compile_gemm(cfg: KernelConfig, kind: str, fp8: bool = True, act: str = "bf16") -> Compiled:
    """The grouped GEMM as ``moe_gemm_up`` (kind "up") or ``moe_gemm_down`` ("down") launches it."""
    a = "fp8e4nv" if fp8 else act
    ptr = {"a_ptr": f"*{a}", "a_scale_ptr": "*fp32" if fp8 else f"*{a}",
           "b_ptr": f"*{a}", "b_scale_ptr": "*fp32" if fp8 else f"*{a}", "c_ptr": f"*{act}",
           "route_w_ptr": "*fp32" if kind == "down" else f"*{act}",
           "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32"}
    ints = dict.fromkeys(["num_pairs", "N", "K", "a_row_div", "num_m_blocks", "stride_am",
                          "stride_ak", "stride_be", "stride_bn", "stride_bk", "stride_cm",
                          "stride_cn", "stride_asm", "stride_ask", "stride_bse", "stride_bsn",
                          "stride_bsk"], "i32")
    constexprs = dict(GATHER_A=kind == "up", SCATTER_C=kind == "down",
                      MUL_ROUTE_W=kind == "down", BLOCK_FP8=fp8, GROUP_N=128, GROUP_K=128,
                      DOT_FP32=False, EVEN_K=True, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      BLOCK_K=cfg.block_k, GROUP_SIZE_M=cfg.group_m)
    # unit strides are specialised to the constant 1 at launch
    for name in ("stride_ak", "stride_bk", "stride_cn", "stride_ask", "stride_bsk"):
        ints.pop(name)
        constexprs[name] = 1
    if kind == "down":
        ints.pop("a_row_div")
        constexprs["a_row_div"] = 1
    return compile_sm90(gemm_triton._moe_gemm_kernel, {**ptr, **ints}, constexprs,
                        cfg.num_warps, cfg.num_stages)


def compile_support_kernels(act: str = "bf16") -> list[Compiled]:
    """Routing, alignment, fused SwiGLU + quant and combine, as the launchers call them."""
    i32 = "i32"
    return [
        compile_sm90(routing_triton._route_kernel,
                     {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "w_ptr": "*fp32",
                      "ids_ptr": "*i32", "T": i32, "E": i32, "scaling": "fp32", "stride_l": i32},
                     dict(TOP_K=8, K_PAD=8, E_PAD=512, BLOCK_T=8, RENORMALIZE=True, PRECISE=True)),
        compile_sm90(routing_triton._count_kernel, {"ids_ptr": "*i32", "counts_ptr": "*i32",
                                                    "num_pairs": i32}, dict(CHUNK=1024)),
        compile_sm90(routing_triton._scatter_kernel,
                     {"ids_ptr": "*i32", "counts_ptr": "*i32", "sorted_ids_ptr": "*i32",
                      "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32", "num_pairs": i32,
                      "num_experts": i32}, dict(BLOCK_M=64, E_PAD=512, CHUNK=1024)),
        compile_sm90(act_triton._swiglu_kernel,
                     {"h_ptr": f"*{act}", "y_ptr": "*fp8e4nv", "q_ptr": "*fp8e4nv",
                      "s_ptr": "*fp32", "num_rows_ptr": "*i32", "I": i32, "num_groups": i32,
                      "limit": "fp32", "stride_h": i32, "stride_y": i32, "stride_s": i32},
                     dict(QUANT=True, FP8_MAX_C=448.0, INV_FP8_MAX_C=INV_FP8_MAX, GROUP=128,
                          UNITS=16, PRECISE=True)),
        compile_sm90(quant_triton._quant_act_kernel,
                     {"x_ptr": f"*{act}", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32",
                      "num_rows_ptr": "*i32", "K": i32, "num_groups": i32, "total_rows": i32,
                      "stride_x": i32, "stride_q": i32, "stride_s": i32},
                     dict(FP8_MAX_C=448.0, INV_FP8_MAX_C=INV_FP8_MAX, GROUP=128, UNITS=16,
                          HAS_NUM_ROWS=True, SCALE_BY_RECIPROCAL=True)),
        compile_sm90(act_triton._combine_kernel,
                     {"pair_ptr": f"*{act}", "ids_ptr": "*i32", "out_ptr": f"*{act}", "D": i32,
                      "num_experts": i32}, dict(TOP_K=8, BLOCK_D=1024)),
    ]


def compile_grouped(cfg, kind: str, act: str = "bf16") -> Compiled:
    """The persistent grouped kernel (grouped_triton) as ``grouped_up`` / ``grouped_down``
    launch it; ``cfg`` a ``GroupedConfig``."""
    from glmlab.kernels.moe import grouped_triton as gt

    up = kind == "up"
    bk = gt.BLOCK_K
    types = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32",
             "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {bk}]>", "b_scale_ptr": "*fp32",
             "out_ptr": "*fp8e4nv" if up else f"*{act}",
             "out_scale_ptr": "*fp32" if up else f"*{act}", "route_w_ptr": "*fp32",
             "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32",
             "limit": "fp32"}
    types |= dict.fromkeys(["num_pairs", "N", "K", "b_rows_per_expert", "a_row_div",
                            "stride_am", "stride_asm", "stride_bse", "stride_bsn", "stride_om",
                            "stride_osm"], "i32")
    a_tma = not (up and cfg.gather_a)
    constexprs = dict(UP=up, A_TMA=a_tma, SWAP_AB=cfg.swap_ab,
                      WARP_SPECIALIZE=cfg.warp_specialize, FLATTEN=cfg.flatten, PRECISE=True,
                      FP8_MAX_C=448.0, ACT=getattr(tl, {"bf16": "bfloat16"}.get(act, act)),
                      INV_FP8_MAX_C=INV_FP8_MAX, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      BLOCK_K=bk, GROUP_M=cfg.group_m)
    if a_tma:
        types["a_desc"] = f"tensordesc<fp8e4nv[{cfg.block_m}, {bk}]>"
    else:
        constexprs["a_desc"] = None
    if not up:
        constexprs["a_row_div"] = 1
        constexprs["stride_osm"] = 0
    return compile_sm90(gt._grouped_kernel, types, constexprs, cfg.num_warps, cfg.num_stages)


def sass(compiled: Compiled) -> str:
    """SASS of a compiled kernel, by the cuobjdump bundled with Triton."""
    import os
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.cubin)
        f.flush()
        return subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def resource_usage(compiled: Compiled) -> dict:
    """Registers per thread and spill stores/loads of a compiled kernel (from its SASS)."""
    import re

    text = sass(compiled)
    regs = max((int(r) for r in re.findall(r"\bR(\d+)\b", text)), default=-1) + 1
    return {"regs": regs, "spill_stores": len(re.findall(r"\bSTL\b", text)),
            "spill_loads": len(re.findall(r"\bLDL\b", text)), "qgmma": text.count("QGMMA"),
            "utmaldg": text.count("UTMALDG"), "ldgsts": text.count("LDGSTS"),
            "warp_specialized": "setmaxnreg" in compiled.ptx}


def compile_gluon(cfg, kind: str, act: str = "bf16") -> Compiled:
    """The warp-specialised Gluon kernels as ``gluon_up`` / ``gluon_down`` (``cfg`` a
    ``GluonConfig``, grouped_gluon) or ``gluon_decode_up`` / ``_down`` (a
    ``GluonDecodeConfig``, grouped_gluon_decode) launch them."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from glmlab.kernels.moe import grouped_gluon as gg
    from glmlab.kernels.moe import grouped_gluon_decode as gd

    up = kind == "up"
    decode = isinstance(cfg, gd.GluonDecodeConfig)
    if decode:
        a_layout, b_layout = gd._layouts(cfg.tok)
        a_box, b_box = [cfg.tok, gd.STEP_K], [gd.HALF, gd.STEP_K]
        names = dict(a_desc="x_desc", b_desc="w_desc", a_scale_ptr="x_scale_ptr",
                     b_scale_ptr="w_scale_ptr", b_rows_per_expert="w_rows_per_expert",
                     stride_asm="stride_xsm", stride_bse="stride_wse", stride_bsn="stride_wsn")
    else:
        a_layout, b_layout = gg._layouts()
        a_box, b_box = [gg.WG_M, gg.STEP_K], [gg.HALF, gg.STEP_K]
        names = {}
    types = {"a_desc": f"tensordesc<fp8e4nv{a_box},{a_layout!r}>",
             "b_desc": f"tensordesc<fp8e4nv{b_box},{b_layout!r}>",
             "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32",
             "out_ptr": "*fp8e4nv" if up else f"*{act}",
             "out_scale_ptr": "*fp32" if up else f"*{act}", "route_w_ptr": "*fp32",
             "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32",
             "limit": "fp32"}
    types |= dict.fromkeys(["num_pairs", "N", "K", "b_rows_per_expert", "stride_asm",
                            "stride_bse", "stride_bsn", "stride_om", "stride_osm"], "i32")
    constexprs = dict(UP=up, PRECISE=True, FP8_MAX_C=448.0, INV_FP8_MAX_C=INV_FP8_MAX,
                      ACT=getattr(tl, {"bf16": "bfloat16"}.get(act, act)), STAGES=cfg.stages,
                      GROUP_M=cfg.group_m, CONSUMER_REGS=cfg.consumer_regs)
    if not up:
        constexprs["stride_osm"] = 0
    if decode:
        constexprs["TOK"] = cfg.tok
    types = {names.get(k, k): v for k, v in types.items()}
    fn = gd._gluon_decode_kernel if decode else gg._gluon_grouped_kernel
    signature = {name: ("constexpr" if name in constexprs else types[name])
                 for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in constexprs and (types[name].startswith("*") or types[name] == "i32")
             and name not in fn_no_specialize(fn)}
    src = GluonASTSource(fn, signature, {k: tl.constexpr(v) for k, v in constexprs.items()},
                         attrs)
    out = triton.compile(src, target=SM90, options={"num_warps": 4, "maxnreg": gg.MAXNREG})
    return Compiled(fn.__name__, out.asm["ptx"], out.metadata.shared, 4, out.asm.get("cubin", b""))
