"""Speculative decoding on the hybrid model: draft -> verify -> accept -> commit.

- ``config``: ``SpecConfig`` (mtp | dflash2, sizes, commit mode, draft-KV dtype, simulated
  acceptance).
- drafters: ``mtp`` (the checkpoint's MTP layer as a top-k 1 chain), ``dflash`` (DFlash2 block
  drafter fed with target features) with ``selector`` (candidate selector), ``draft_kv`` (BF16 /
  FP8 rows at the target's token slots), ``dflash_config`` / ``dflash_io`` (draft checkpoints),
  ``oracle`` (proposes a known continuation: full-acceptance tests).
- ``verify``: greedy longest prefix + bonus; rejection sampling against the proposal.
- ``replay`` (ReplaySSM ring, post-step snapshots) and ``commit`` (``SpecStateStore``: what a verify
  records of the carried state, and the rollback to the accepted prefix).
- ``cycle``: ``SpecDecoder`` over any ``CacheLayout`` (``layout``: a ``Session``;
  ``engine_phase``: the engine's ``Phase.VERIFY``); ``factory`` builds it from a ``SpecConfig``.
- ``sim`` (simulated acceptance), ``costs`` (the reference deployment's cost model and numbers),
``memory``
  (verify-state and draft-KV bytes), ``check`` (speculative vs plain decoding on one model).
"""
