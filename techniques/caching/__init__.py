"""Caching family: reuse transformer work across denoising steps.

``first_block`` (first-block residual cache), ``teacache`` (accumulated modulated-input change) and
``step_skip`` (fixed mask of reused steps). State is kept per stage, guidance pass and stage-2 tile.
"""

from vidtune.techniques.caching import first_block, step_skip, teacache  # noqa: F401  (registers)
