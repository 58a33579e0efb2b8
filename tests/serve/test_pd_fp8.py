"""1P1D with FP8 caches on both roles (FP8 latent KV and FP8 pooled indexer keys with their
per-pool scales): the transfer carries every region the cache lists, and the greedy tokens equal
a mixed server's and ``glmlab generate``'s with the same flags."""

from __future__ import annotations

from tests.serve.conftest import (
    ENGINE,
    PAGE,
    cli_generate,
    generate,
    http,
    mixed_service,
    pd_service,
    transfer_bytes,
)

FP8 = {**ENGINE, "kv_dtype": "fp8", "index_dtype": "fp8"}
PROMPT = [(i * 37 + 11) % 250 for i in range(70)]  # 70 tokens: 5 pages of 16, 17 indexer pools


def test_pd_with_fp8_kv_and_index_keys_matches_mixed_and_generate(tmp_path):
    page_bytes, fixed = transfer_bytes(kv_fp8=True, index_fp8=True)
    with pd_service(tmp_path / "pd", engine=FP8) as pd, \
            mixed_service(tmp_path / "mixed", engine=FP8) as mixed:
        for name in ("prefill0", "decode0"):
            engine = http(pd.worker(name).url + "/server_info")[1]["engine"]
            assert (engine["kv_dtype"], engine["index_dtype"]) == ("fp8", "fp8"), (name, engine)
        via_router = generate(pd.url, PROMPT, 12)
        direct = generate(mixed.children[0].url, PROMPT, 12)
        cli = cli_generate(PROMPT, 12, "--kv-dtype", "fp8", "--index-dtype", "fp8")
        assert via_router["output_ids"] == direct["output_ids"] == cli
        # FP8 rows (latent + scale, keys + per-pool scales, bf16 tails) are what crossed NIXL
        sent = via_router["meta_info"]["pd_transfer"]
        assert sent["pages"] == 5 and sent["bytes"] == 5 * page_bytes + fixed
        # a second prompt sharing 4 whole pages: decode's kv_only match, only the rest is sent
        again = generate(pd.url, PROMPT[: 4 * PAGE] + [3] * 10, 4)
        assert again["meta_info"]["pd_transfer"]["decode_prefix_len"] == 4 * PAGE
        assert again["meta_info"]["pd_transfer"]["bytes"] == page_bytes + fixed
        assert again["output_ids"] == generate(mixed.children[0].url,
                                               PROMPT[: 4 * PAGE] + [3] * 10, 4)["output_ids"]
        for name in ("prefill0", "decode0"):
            assert http(pd.worker(name).url + "/server_info")[1]["leak_check"] == "ok"
