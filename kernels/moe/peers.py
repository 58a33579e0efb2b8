"""Third-party peers of the MoE GEMMs, for benchmarks only: SGLang's Triton kernel and torch's.

- ``load_sglang(wheel)``: SGLang's ``fused_moe_triton_kernels`` module, read from its wheel as
  shipped. Importing sglang itself pulls in its serving runtime (pybase64, zmq, sgl_kernel...),
  which the H200 machine does not have, so the module file is extracted and executed with
  stand-ins for the seven host-side helpers it imports (platform checks that answer as sglang
  answers on an H200 with CUDA >= 12.3, an env flag read as its default, and quantisers that are
  never reached because A is passed already quantised). The Triton kernels and
  ``invoke_fused_moe_kernel`` run unmodified. ``sglang_configs`` picks the shipped tile table by
  sglang's own file name and version fallback (newest Triton directory first), or its block-FP8
  default.
- ``torch_block_mm``: one expert's GEMM via ``torch._scaled_mm`` with 1x128 / 128x128 block scales
  (cuBLASLt on sm_90): the same recipe as ours. ``torch_grouped_block``: the grouped form via
  ``F.scaled_grouped_mm``; torch may not support block scales there on sm_90 (the caller records
  the error).

``python -m glmlab.kernels.moe.peers slim WHEEL`` writes the slim copy under ``.whl/``.
Nothing here is imported by the model or the engine.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import torch

KERNELS = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
CONFIGS = "sglang/srt/layers/moe/moe_runner/triton_utils/configs/"
# sglang's get_default_config for block-FP8 weights without a tuned file
SGLANG_BLOCK_FP8_DEFAULT = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
                            "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 3}


def slim_wheel(wheel: str | Path, out_dir: str | Path = ".whl") -> Path:
    """A copy of ``wheel`` holding only what the peer reads (the kernel module and the tile
    tables: ~0.2 MB instead of 39 MB), named ``sglang-<version>-moe-peer.whl`` so
    ``find_wheel`` takes it; the GPU run carries this instead of the wheel."""
    version = Path(wheel).name.split("-")[1]
    out = Path(out_dir) / f"sglang-{version}-moe-peer.whl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in src.namelist():
            if name == KERNELS or name.startswith(CONFIGS):
                dst.writestr(name, src.read(name))
    return out


def find_wheel(root: str | Path = ".") -> Path | None:
    hits = sorted(glob.glob(str(Path(root) / ".whl" / "sglang-*.whl")))
    return Path(hits[-1]) if hits else None


def _stand_ins() -> dict[str, types.ModuleType]:
    cuda = torch.cuda.is_available()
    cap = torch.cuda.get_device_capability() if cuda else (0, 0)
    cuda_ver = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])

    def unreachable(*_a, **_k):
        raise RuntimeError("glmlab passes A already quantised; sglang's quantisers are not loaded")

    class _Flag:
        def __init__(self, value):
            self.value = value

        def get(self):
            return self.value

    mods = {}

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so submodules resolve
        m.__dict__.update(attrs)
        mods[name] = m

    for pkg in ("sglang", "sglang.kernels", "sglang.kernels.jit", "sglang.kernels.ops",
                "sglang.kernels.ops.quantization", "sglang.srt", "sglang.srt.layers",
                "sglang.srt.layers.moe"):
        mod(pkg)
    mod("sglang.kernels.jit.utils", is_arch_support_pdl=lambda: cuda and cap[0] >= 9)
    mod("sglang.kernels.ops.quantization.fp8_kernel", per_token_group_quant_fp8=unreachable,
        scaled_fp8_quant=unreachable, sglang_per_token_group_quant_fp8=unreachable)
    mod("sglang.kernels.ops.quantization.int8_kernel", per_token_group_quant_int8=unreachable,
        per_token_quant_int8=unreachable, sglang_per_token_group_quant_int8=unreachable)
    mod("sglang.srt.batch_invariant_ops", is_batch_invariant_mode_enabled=lambda: False)
    mod("sglang.srt.environ", envs=types.SimpleNamespace(SGLANG_USE_AITER=_Flag(False)))
    mod("sglang.srt.layers.moe.utils", get_moe_padding_size=lambda _aiter: 0)
    mod("sglang.srt.utils", cpu_has_amx_support=lambda: False, is_cpu=lambda: not cuda,
        is_cuda=lambda: cuda, is_hip=lambda: False,
        is_sm90_supported=lambda: cuda and cap[0] == 9 and cuda_ver >= (12, 3))
    return mods


def load_sglang(wheel: str | Path) -> types.ModuleType:
    """SGLang's fused-MoE Triton kernel module from ``wheel`` (see the module docstring)."""
    with zipfile.ZipFile(wheel) as zf:
        src = zf.read(KERNELS)
    # Triton reads kernel source through inspect: the module must live in a real file
    out_dir = Path(tempfile.gettempdir()) / f"glmlab-peer-{Path(wheel).stem}"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "sglang_fused_moe_triton_kernels.py"
    path.write_bytes(src)
    saved = {k: sys.modules.get(k) for k in _stand_ins()}
    stand_ins = _stand_ins()
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location("sglang_fused_moe_triton_kernels", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:  # the module keeps what it imported; nothing named sglang stays importable
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    module.WHEEL = str(wheel)
    return module


def sglang_configs(wheel: str | Path, num_experts: int, inter: int, device_name: str,
                   triton_version: str) -> tuple[dict | None, dict | None, str]:
    """(up table, down table, source) as sglang's get_moe_configs finds them for block-FP8
    [128, 128] weights: the exact Triton version's directory, else the newest one that has the
    file; a missing down table reuses the up table. Tables map M -> config dicts."""
    name = (f"E={num_experts},N={inter},device_name={device_name.replace(' ', '_')},"
            f"dtype=fp8_w8a8,block_shape=[128, 128]")
    with zipfile.ZipFile(wheel) as zf:
        files = set(zf.namelist())
        versions = sorted({f[len(CONFIGS):].split("/")[0] for f in files
                           if f.startswith(CONFIGS + "triton_")},
                          key=lambda d: tuple(int(x) for x in d[7:].split("_")), reverse=True)
        exact = "triton_" + triton_version.replace(".", "_")
        order = [exact] + [v for v in versions if v != exact]

        def find(suffix):
            for v in order:
                f = f"{CONFIGS}{v}/{name}{suffix}.json"
                if f in files:
                    return {int(k): c for k, c in json.loads(zf.read(f)).items()}, v
            return None, None

        up, up_dir = find("")
        down, down_dir = find("_down")
    if down is None and up is not None:
        down = {m: {k: v for k, v in c.items() if k != "USE_TMA"} for m, c in up.items()}
    source = f"shipped {up_dir}/{name}.json" if up else "sglang block-FP8 default"
    return up, down, source


def pick(table: dict | None, m: int) -> dict:
    """sglang's choice for M tokens: the nearest tuned M, or its default config."""
    if not table:
        return dict(SGLANG_BLOCK_FP8_DEFAULT)
    return dict(table[min(table, key=lambda k: abs(k - m))])


def block_scales_a(scale: torch.Tensor) -> torch.Tensor:
    """Per-token-group scales [M, K/128] in the outer-dim-major layout cuBLASLt wants."""
    return scale.t().contiguous().t()


_BLOCK_MM_API: list[str] = []  # which torch entry point took block scales here


def torch_block_mm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor,
                   w_scale: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """a [M, K] E4M3 (M a multiple of 16) x w [N, K] E4M3 with a_scale [M, K/128] and block
    scales w_scale [N/128, K/128]: ``torch._scaled_mm`` block-wise (1x128, 128x128), or
    ``F.scaled_mm`` with explicit recipes where the legacy entry point refuses them."""
    import torch.nn.functional as F

    sa, sb = block_scales_a(a_scale), w_scale.t()
    if not _BLOCK_MM_API:
        try:
            out = torch._scaled_mm(a, w.t(), sa, sb, out_dtype=out_dtype)
            _BLOCK_MM_API.append("torch._scaled_mm")
            return out
        except (RuntimeError, ValueError):
            _BLOCK_MM_API.append("F.scaled_mm")
    if _BLOCK_MM_API[0] == "torch._scaled_mm":
        return torch._scaled_mm(a, w.t(), sa, sb, out_dtype=out_dtype)
    st = F.ScalingType
    return F.scaled_mm(a, w.t(), sa, st.BlockWise1x128, sb, st.BlockWise128x128,
                       output_dtype=out_dtype)


def torch_grouped_block(a, a_scale, w, w_scale, offs, out_dtype=torch.bfloat16):
    """All experts in one ``F.scaled_grouped_mm`` with block scales (a [R, K], w [E, N, K])."""
    import torch.nn.functional as F

    st = F.ScalingType
    return F.scaled_grouped_mm(a, w.transpose(1, 2), block_scales_a(a_scale), st.BlockWise1x128,
                               w_scale.transpose(1, 2), st.BlockWise128x128, offs=offs,
                               output_dtype=out_dtype)


class SGLangMoE:
    """SGLang's kernels on glmlab's inputs, launched as its ``fused_experts`` launches them for
    block-FP8 weights with pre-quantised activations: ``up`` (gate_up GEMM, bf16 out, TMA on the
    weights when the table says USE_TMA; output in sorted row order when the *down* table uses
    TMA), ``act`` (its ``act_and_mul_triton`` with the swiglu clamp), ``down`` (routing weight in
    the epilogue; TMA on both operands when its table says so). Alignment, activation
    quantisation and the final sum are glmlab's (sglang's are CUDA ops outside the wheel's
    Triton module); the caller states that."""

    def __init__(self, module, up_table: dict | None, down_table: dict | None, m: int):
        self.k = module
        self.up_cfg, self.down_cfg = pick(up_table, m), pick(down_table, m)
        self.up_tma = bool(self.up_cfg.pop("USE_TMA", False))
        self.down_tma = bool(self.down_cfg.pop("USE_TMA", False))

    def _invoke(self, a, a_s, w, w_s, c, topk_w, ids, align, mul_w, top_k, cfg, a_tma, b_tma,
                c_sorted):
        import triton.language as tl

        self.k.invoke_fused_moe_kernel(
            a, w, None, c, a_s, w_s, None, topk_w, ids, align.sorted_ids, align.expert_ids,
            align.num_padded, mul_w, top_k, dict(cfg), compute_type=tl.bfloat16,
            use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False,
            use_int4_w4a16=False, per_channel_quant=False, block_shape=[128, 128],
            a_use_tma=a_tma, b_use_tma=b_tma, c_sorted=c_sorted)

    def up(self, xq, xs, w13, w13_scale, topk_w, ids, align) -> torch.Tensor:
        rows = align.max_rows if self.down_tma else ids.numel()
        h = torch.empty(rows, w13.shape[1], dtype=torch.bfloat16, device=xq.device)
        self._invoke(xq, xs, w13, w13_scale, h, topk_w, ids, align, False, ids.shape[1],
                     self.up_cfg, False, self.up_tma, self.down_tma)
        return h

    def act(self, h, ids, align, limit: float) -> torch.Tensor:
        y = torch.empty(h.shape[0], h.shape[1] // 2, dtype=h.dtype, device=h.device)
        self.k.act_and_mul_triton(h, y, self.up_cfg | {"BLOCK_SIZE_M": align.block_m}, ids,
                                  align.expert_ids, self.down_tma, "silu", limit)
        return y

    def down(self, h8, hs, w2, w2_scale, topk_w, ids, align) -> torch.Tensor:
        out = torch.empty(ids.numel(), w2.shape[1], dtype=torch.bfloat16, device=h8.device)
        self._invoke(h8, hs, w2, w2_scale, out, topk_w, ids, align, True, 1, self.down_cfg,
                     self.down_tma, self.down_tma, False)
        return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "slim":
        raise SystemExit("usage: python -m glmlab.kernels.moe.peers slim SGLANG_WHEEL")
    print(slim_wheel(sys.argv[2]))
