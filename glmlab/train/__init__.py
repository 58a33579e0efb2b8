"""Training and evaluation of GLM-5.3-shaped models on the Python standard library.

- ``corpus``: the stdlib sources, split by path hash; the committed manifest and eval text.
- ``tokenizer``: byte-level BPE trained on the train split, in the published file layout.
- ``tokens``: token streams and training windows.
- ``configs``: which model configs ``glmlab train`` accepts (``small``, ``micro``, a path).
- ``attention`` / ``forward``: the serving modules run over [B, T] windows with autograd, and the
  losses (next token, MTP chain depths, DSA indexer KL).
- ``init``, ``optim``, ``balance``, ``runlog``: initial weights, AdamW on fp32 masters with
  warm-up + cosine, aux-loss-free router balancing, progress and records.
- ``trainer``: ``train_target``; ``draft``: ``train_draft`` (DFlash2 on the target's features).
- ``evaluate``: bits per byte and next-line exact match under any engine setting.
- ``acceptance``: measured speculative acceptance (MTP chains, DFlash2 blocks) and routing samples.

Layer: beside ``bench`` and ``commands`` (it imports the model, cache, engine and speculative
packages; nothing imports it but the commands).
"""
