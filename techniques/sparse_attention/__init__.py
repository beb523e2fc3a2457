"""Sparse attention family: stage-2 video self-attention with fewer key blocks (Sol-style routing,
block-sparse control, NATTEN windows). Techniques land with issue "Technique families II"."""
