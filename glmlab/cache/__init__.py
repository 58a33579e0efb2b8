"""The hybrid cache of GLM-5.3-Flash: paged KV for the DSA layers, recurrent-state slots for the
KDA layers, and how they are shared and sized.

- ``storage``: the tensors and their number formats (``ModelCache``, FP8 KV);
- ``pools``: free lists with reference counts; ``radix``: the page-granular prefix tree;
- ``hybrid``: ``HybridCache``, the one API the scheduler uses;
- ``spec``, ``budget``, ``budget_report``: bytes per token and slot, pool sizes, caps,
  the reference deployment's table.
"""
