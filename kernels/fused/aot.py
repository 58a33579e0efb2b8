"""Ahead-of-time sm_90 compilation of the decode-step kernels (fused small ops, KDA prep and window,
paged indexer) at GLM-5.3-Flash widths, without a GPU (``glmlab.kernels.moe.aot.compile_sm90``).

CPU machines only run these kernels in the interpreter, which accepts programs the real compiler
rejects (and never allocates registers or shared memory); compiling them for H200 here catches
that before a GPU run. Knows nothing about the model.
"""

from __future__ import annotations

from glmlab.kernels.decode import indexer_triton, kda_window_triton
from glmlab.kernels.fused import mhc_triton, norm_triton, router_triton
from glmlab.kernels.kda import prep_triton
from glmlab.kernels.moe.aot import Compiled, arg_types, compile_sm90


def compile_decode_kernels(act: str = "bf16") -> list[Compiled]:
    """Each kernel once, with the constexprs the launchers use at full width (D 4096, 4 streams,
    288 experts top-8, 64 KDA heads x 128, 32 indexer heads x 128, top-512 pools)."""
    out = []
    k = mhc_triton._mix_kernel
    ptr = {a: "*fp32" for a in ("post_ptr", "comb_ptr", "base_ptr", "scale_ptr", "pre_o",
                                "post_o", "comb_o", "ws_m", "ws_s")}
    ptr |= {"x_ptr": f"*{act}", "y_ptr": f"*{act}", "xo_ptr": f"*{act}", "fn_ptr": f"*{act}",
            "ticket_ptr": "*i32"}
    out.append(compile_sm90(k, arg_types(k, ptr, ("eps", "norm_eps")),
                            dict(N=4, P=24, P_PAD=32, HAS_MIX=True, HAS_COEF=True, SPLITS=8,
                                 CHUNKS=4, DOT_FP32=False, PRECISE=True, BT=16, BD=128),
                            num_stages=1))
    k = mhc_triton._collapse_norm_kernel
    out.append(compile_sm90(k, arg_types(k, {"x_ptr": f"*{act}", "pre_ptr": "*fp32",
                                          "w_ptr": f"*{act}", "h_ptr": f"*{act}"}, ("eps",)),
                            dict(N=4, BD=4096), num_warps=8))
    k = norm_triton._rmsnorm_kernel
    out.append(compile_sm90(k, arg_types(k, {a: f"*{act}" for a in ("x_ptr", "r_ptr", "w_ptr",
                                                                 "h_ptr", "s_ptr")}, ("eps",)),
                            dict(HAS_RES=True, BD=4096), num_warps=8))
    k = router_triton._router_kernel
    out.append(compile_sm90(k, arg_types(k, {"h_ptr": f"*{act}", "w_ptr": f"*{act}",
                                          "bias_ptr": "*fp32", "ws_ptr": "*fp32",
                                          "wout_ptr": "*fp32", "iout_ptr": "*i32",
                                          "ticket_ptr": "*i32"}, ("scaling",)),
                            dict(TOP_K=8, K_PAD=8, E_PAD=512, BT=16, BE=16, BK=128, KS=4,
                                 RENORMALIZE=True, DOT_FP32=False, PRECISE=True)))
    k = prep_triton._prep_kernel
    ptr = {a: f"*{act}" for a in ("qkv_ptr", "conv_ptr", "f_ptr", "b_ptr", "v_ptr", "beta_ptr")}
    ptr |= {a: "*fp32" for a in ("cw_ptr", "alog_ptr", "dtb_ptr", "q_ptr", "k_ptr", "g_ptr")}
    ptr["slots_ptr"] = "*i64"
    out.append(compile_sm90(k, arg_types(k, ptr, ("lower_bound",)), dict(K=128, PRECISE=True),
                            num_warps=2))
    k = kda_window_triton._window_kernel
    ptr = {a: "*fp32" for a in ("q_ptr", "k_ptr", "g_ptr", "state_ptr")}
    ptr |= {a: f"*{act}" for a in ("v_ptr", "beta_ptr", "gate_ptr", "nw_ptr", "out_ptr")}
    ptr["slots_ptr"] = "*i64"
    out.append(compile_sm90(k, arg_types(k, ptr, ("eps",)),  # a 128 x 128 head in 32-column slices
                            dict(K=128, V=128, BV=32, STORE_STATE=True, PRECISE=True),
                            num_warps=4))
    k = kda_window_triton._gate_norm_kernel
    ptr = {a: f"*{act}" for a in ("out_ptr", "gate_ptr", "nw_ptr")}
    out.append(compile_sm90(k, arg_types(k, ptr, ("eps",)), dict(V=128, PRECISE=True),
                            num_warps=1))
    k = indexer_triton._pool_update_kernel
    ptr = {"k_ptr": f"*{act}", "gate_ptr": f"*{act}", "tail_ptr": f"*{act}",
           "keys_ptr": "*fp8e4nv", "kscale_ptr": "*fp32", "ape_ptr": "*fp32",
           "slots_ptr": "*i64", "pos_ptr": "*i64", "pt_ptr": "*i64"}
    out.append(compile_sm90(k, arg_types(k, ptr), dict(KPOOL=4, DI=128, FP8_KEYS=True),
                            num_warps=1))
    k = indexer_triton._scores_kernel
    ptr = {"q_ptr": f"*{act}", "w_ptr": "*fp32", "keys_ptr": "*fp8e4nv", "kscale_ptr": "*fp32",
           "pos_ptr": "*i64", "pt_ptr": "*i64", "out_ptr": "*fp32"}
    out.append(compile_sm90(k, arg_types(k, ptr, ("softmax_scale",)),
                            dict(HI=32, HP=32, DI=128, KPOOL=4, TOPK=512, BP=64, FP8_KEYS=True,
                                 DOT_FP32=False)))
    k = indexer_triton._select_kernel
    out.append(compile_sm90(k, arg_types(k, {"score_ptr": "*fp32", "pos_ptr": "*i64",
                                          "pt_ptr": "*i64", "out_ptr": "*i32"}),
                            dict(KPOOL=4, TOPK=512, TAIL=True, BP=256)))
    return out
