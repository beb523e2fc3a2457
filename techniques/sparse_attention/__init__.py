"""Sparse attention family: stage-2 video self-attention with fewer key blocks.

``sol`` (query-dependent routing with a correction for skipped blocks) and ``block_sparse`` (the same
routing without it) have a PyTorch reference path here (their Triton/CuTe kernels are still to come);
``window`` is a static 3-D neighbourhood through NATTEN's ``na3d``.
"""

from vidtune.techniques.sparse_attention import sol, window  # noqa: F401  (registers)
