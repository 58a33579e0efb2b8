"""``glmlab dist`` flags parse into the configs the ranks run (the launch itself is exercised by
test_cp_prefill.py)."""

from __future__ import annotations

import pytest

from glmlab.cli import build_parser
from glmlab.cliargs import dataclass_from_args
from glmlab.distributed.check import PrefillCase
from glmlab.distributed.cp import CPConfig
from glmlab.distributed.ep_moe import MoEDispatch
from glmlab.distributed.fp8_packet import PacketKernels


def test_dist_flags_build_configs():
    args = build_parser().parse_args(
        ["dist", "--ranks", "4", "--no-head-parallel", "--moe-dispatch", "bf16-then-fp8",
         "--packet-kernels", "triton", "--prompt-lens", "40,21", "--chunk", "16"])
    assert args.ranks == 4 and args.head_parallel is False
    cfg = dataclass_from_args(CPConfig, args)
    assert cfg == CPConfig(MoEDispatch.BF16_THEN_FP8, PacketKernels.TRITON)
    assert dataclass_from_args(PrefillCase, args) == PrefillCase((40, 21), chunk=16)


def test_dist_defaults_and_bad_dispatch():
    args = build_parser().parse_args(["dist"])
    assert dataclass_from_args(CPConfig, args) == CPConfig()
    with pytest.raises(SystemExit):  # argparse lists the choices and exits with status 2
        build_parser().parse_args(["dist", "--moe-dispatch", "fp4"])
    with pytest.raises(ValueError):  # the config itself still refuses a bad value
        CPConfig(moe_dispatch="fp4")
