"""TP/EP per role and PD speculation, the parts that need no process: the layout each flag gives,
where each rank runs, which drafter settings prefill takes, and the pairing check that refuses
workers whose ranks, pages, drafter state or regions differ, naming what differs."""

from __future__ import annotations

import pytest

from glmlab.cli import build_parser
from glmlab.commands.serve import build_service
from glmlab.serve.bootstrap import PeerInfo, pairing_problem
from glmlab.serve.config import Role, ServeConfig, engine_config, prefill_options
from glmlab.serve.transfer import Region


def _serve(*flags: str):
    return build_service(build_parser().parse_args(["serve", *flags]), quiet=True)


def test_tp_and_ep_flags_reach_each_role_and_rank_devices():
    cfg = ServeConfig(prefill_tp=4, decode_tp=4, decode_ep=4, prefill_devices=("cuda:0",),
                      decode_devices=("cuda:4",))
    prefill, decode = cfg.layout()
    assert (prefill.tp, prefill.ep, decode.tp, decode.ep) == (4, 1, 4, 4)
    assert [decode.rank_device(r) for r in range(4)] == ["cuda:4", "cuda:5", "cuda:6", "cuda:7"]
    assert prefill.rank_device(3) == "cuda:3"
    assert ServeConfig(prefill_tp=2).layout()[0].rank_device(1) == "cpu"
    mixed = ServeConfig(mode="mixed", decode_tp=2).layout()[0]
    assert mixed.tp == 2  # mixed workers take decode's sizes, as they take its engine flags
    svc = _serve("--prefill-tp", "2", "--decode-tp", "2", "--decode-ep", "2")
    assert [(s.role, s.tp, s.ep) for s in svc.cfg.layout()] == [(Role.PREFILL, 2, 1),
                                                                (Role.DECODE, 2, 2)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(decode_tp=2, decode_ep=3), "ep 1 or equal to tp"),
    (dict(prefill_tp=0), "tp must be >= 1"),
    (dict(prefill_tp=2, prefill_devices=("cuda:0",), decode_devices=("cuda:1",)),
     "both use cuda:1"),
])
def test_bad_tp_layouts_fail_with_a_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ServeConfig(**kwargs)


def test_single_rank_workers_may_still_share_a_gpu():
    cfg = ServeConfig(prefill_devices=("cuda:0",), decode_devices=("cuda:0",))
    assert [s.device for s in cfg.layout()] == ["cuda:0", "cuda:0"]


def test_prefill_takes_the_drafter_of_decode():
    mtp = {"algorithm": "mtp", "num_steps": 3}
    assert prefill_options({"page_size": 16}, {"speculative": mtp}) == {
        "page_size": 16, "speculative": mtp}
    # a decode-only flag gives prefill the same drafter (it learns prompts for decode's)
    svc = _serve("--decode-speculative-algorithm", "mtp", "--decode-speculative-num-steps", "2")
    p, d = (engine_config(r, svc.engine_options[r], "cpu") for r in (Role.PREFILL, Role.DECODE))
    assert p.speculative == d.speculative and d.speculative.width == 3
    both = _serve("--speculative-algorithm", "mtp")
    assert both.engine_options[Role.PREFILL]["speculative"] == {"algorithm": "mtp"}
    with pytest.raises(ValueError, match="runs on decode workers"):
        _serve("--prefill-speculative-algorithm", "mtp")
    with pytest.raises(ValueError, match="algorithm"):
        _serve("--prefill-speculative-algorithm", "mtp", "--decode-speculative-algorithm",
               "dflash2", "--decode-speculative-draft-path", "/nowhere")


def _info(name: str, rows: dict[str, int], drafter: str = "", page: int = 16,
          ranks: tuple = ()) -> PeerInfo:
    regions = {n: Region(n, 4096 * i, b, 10) for i, (n, b) in enumerate(rows.items())}
    return PeerInfo(name, b"meta", regions, page, drafter, ranks)


def test_pairing_refuses_mismatched_layouts_naming_the_difference():
    rows = {"latent.1": 128, "recurrent.0": 2048}
    half = {"latent.1": 128, "recurrent.0": 1024}  # a rank of tp 2 holds half the KDA heads
    tp2 = _info("p", half, ranks=(_info("p1", half),))
    assert pairing_problem(tp2, _info("d", half, ranks=(_info("d1", half),))) is None
    assert "decode 1" in pairing_problem(tp2, _info("d", rows))
    assert "same TP degree" in pairing_problem(tp2, _info("d", rows))
    assert "page sizes differ" in pairing_problem(_info("p", rows), _info("d", rows, page=64))
    problem = pairing_problem(_info("p", rows), _info("d", rows, drafter="mtp layer 3"))
    assert "prefill sends none" in problem and "mtp layer 3" in problem
    odd = _info("d", half, ranks=(_info("d1", {**half, "draft.k.0": 64}),))
    problem = pairing_problem(tp2, odd)
    assert "rank 1" in problem and "only on decode: ['draft.k.0']" in problem
    problem = pairing_problem(_info("p", rows), _info("d", half))
    assert "recurrent.0: 2048 B rows on prefill, 1024 B on decode" in problem
    # the JSON of /route and /peers keeps every rank and the drafter
    again = PeerInfo.from_json(odd.to_json())
    assert again == odd and again.tp_size == 2 and again.rank(1).agent_name == "d1"
