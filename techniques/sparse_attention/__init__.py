"""Sparse attention family: stage-2 video self-attention with fewer key blocks.

``sol`` (query-dependent routing with a correction for skipped blocks) and ``block_sparse`` (the same
routing without it) run on three backends: the PyTorch reference (any device), a Triton kernel that
computes only the kept blocks (CUDA; Triton's interpreter on a CPU) and a CuTe DSL kernel for Hopper
(``kernels/sol_cute.py``); ``window`` is a static 3-D neighbourhood through NATTEN's ``na3d``; ``token_merge``
attends to the mean keys and values of each small cell of the latent grid.
"""

from vidtune.techniques.sparse_attention import sol, token_merge, window  # noqa: F401  (registers)
