"""SGLang's TileLang sparse-MLA kernels as an in-run benchmark peer, loaded from its module file.

SGLang 0.5.23 ships them in ``sglang/kernels/ops/attention/dsa/tilelang_kernel.py``. Installing
sglang on the GPU machine is not possible (no registry there, and the wheel pulls a large tree),
so ``load_sglang_kernels(path)`` executes that one file as a module. Its two sglang imports are
platform questions (``is_hip``, ``is_gfx95_supported``, ``is_fp8_fnuz``); they are answered with
what an NVIDIA GPU answers (all False, the CUDA branch of every kernel), through stand-in modules
registered only if sglang itself is not importable. Nothing else of sglang is needed: the kernels
import tilelang, torch and functools only.

``sglang_sparse_fwd(mod, q, kv, indices, scale)`` calls the same entry as sglang's DSA backend
(``tilelang_sparse_fwd``): bf16 latent rows -> ``sparse_attention_fwd_kernel_v1`` (T.Pipelined,
2 stages, 64-column tiles, one CTA per row and head group of up to 64 heads); e4m3 rows ->
``sparse_mla_fwd_decode_partial_fp8`` (FP8 Q and KV, FP8 MMAs, 16 heads per CTA, split over the
list) + its combine. Its FP8 path reads raw e4m3 rows (scale 1: our ``FP8_RAW`` layout); it has no
reader for the 528-byte scaled layout. The index list must be a multiple of 64 wide (2112).

What this module does not know: how the peer's numbers compare (``glmlab.bench.ops_dsa``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

MODULE_IN_WHEEL = "sglang/kernels/ops/attention/dsa/tilelang_kernel.py"


def _platform_answers() -> None:
    """Register sglang's two platform modules with CUDA answers, unless sglang is installed."""
    try:
        import sglang.srt.utils  # noqa: F401
        return
    except ImportError:
        pass
    answers = {"sglang.srt.utils": {"is_hip": lambda: False, "is_gfx95_supported": lambda: False},
               "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False}}
    parts = set()
    for name in answers:
        pieces = name.split(".")
        parts.update(".".join(pieces[:i]) for i in range(1, len(pieces)))
    for name in sorted(parts):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = []
            sys.modules[name] = pkg
    for name, funcs in answers.items():
        mod = types.ModuleType(name)
        for fn_name, fn in funcs.items():
            setattr(mod, fn_name, fn)
        sys.modules[name] = mod


def load_sglang_kernels(path: str | Path):
    """Execute SGLang's ``tilelang_kernel.py`` (a path to the file) and return the module."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no sglang TileLang kernel file at {path} (extract "
                                f"{MODULE_IN_WHEEL} from the sglang 0.5.23 wheel)")
    _platform_answers()
    spec = importlib.util.spec_from_file_location("sglang_dsa_tilelang_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sglang_sparse_fwd(mod, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """SGLang's sparse MLA on our inputs.

    Args:
        q: [T, H, R] bf16 (e4m3 for the FP8 path: sglang casts q to the KV dtype, unscaled).
        kv: [N, R] bf16 or float8_e4m3fn latent rows (raw FP8: scale 1).
        indices: [T, W] int32, -1 padded, W a multiple of 64.
    Returns:
        [1, T, H, R] bf16.
    """
    if indices.shape[1] % 64:
        raise ValueError(f"sglang's kernels need an index width that is a multiple of 64, "
                         f"got {indices.shape[1]}")
    return mod.tilelang_sparse_fwd(q, kv[:, None, :], indices[:, None, :], scale,
                                   d_v=q.shape[-1])


def warm_sglang(mod, shapes: list[tuple[int, int]], width: int = 2112, scale: float = 1 / 16,
                workers: int = 8) -> list[str]:
    """Compile SGLang's kernels for ``shapes`` ([(rows, heads)]), bf16 and FP8, in threads.

    Its kernels are specialised on heads, width and (FP8) a split count derived from the row
    count, and compile on first call; calling each shape once on small inputs fills TileLang's
    disk cache, so the timed process only loads them. Returns one line per shape and dtype.
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        rows, heads, dtype = job
        try:
            kv = torch.randn(256, 512, device="cuda").to(dtype)
            q = torch.randn(rows, heads, 512, device="cuda").to(dtype)
            idx = torch.randint(0, 256, (rows, width), device="cuda", dtype=torch.int32)
            sglang_sparse_fwd(mod, q, kv, idx, scale)
            torch.cuda.synchronize()
            return f"sglang {rows}x{heads} {dtype}: ok"
        except Exception as e:  # reported, the benchmark then writes an error row
            return f"sglang {rows}x{heads} {dtype}: {type(e).__name__}: {e}"[:300]

    jobs = [(m, h, d) for m, h in shapes for d in (torch.bfloat16, torch.float8_e4m3fn)]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, jobs))
