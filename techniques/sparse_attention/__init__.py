"""Sparse attention family: stage-2 video self-attention with fewer key blocks.

``sol`` (query-dependent routing with a correction for skipped blocks) and ``block_sparse`` (the same
routing without it) have a PyTorch reference path here; their Triton/CuTe kernels and the NATTEN
``window`` technique are still to come (issue "Technique families II").
"""

from vidtune.techniques.sparse_attention import sol  # noqa: F401  (registers)
