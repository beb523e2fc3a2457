"""Caching family: reuse transformer work across denoising steps.

``first_block`` (first-block residual cache), ``teacache`` (accumulated modulated-input change),
``step_skip`` (fixed mask of reused steps) and ``guidance_cache`` (guidance passes of chosen multistep steps
replaced by their last difference from the conditional pass). State is kept per stage, guidance pass and
stage-2 tile.
"""

from vidtune.techniques.caching import first_block, guidance_cache, step_skip, teacache  # noqa: F401  (registers)
