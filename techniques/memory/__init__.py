"""Memory family: settings that lower the peak GPU memory of a generation so that it fits a smaller card.

``fp8_weights`` (the blocks' linear weights stored as FP8 with their scales, no bf16 copy on the device),
``chunked_ffn`` (the feed-forward layers over the tokens in chunks: a smaller activation peak), ``block_offload``
(transformer blocks streamed from pinned host memory ahead of use) and ``stage_placement`` (the upsampler and the
decoders on the device only while their stage runs; cache cleanup between stages).
Search it with ``gate.peak_memory_gb`` (and ``eval.memory_budget_gb`` to enforce the budget while measuring).
"""

from vidtune.techniques.memory import block_offload, chunked_ffn, fp8_weights, stage_placement  # noqa: F401  (registers)
