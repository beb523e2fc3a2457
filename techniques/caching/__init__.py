"""Caching family: reuse transformer work across denoising steps.

``first_block`` (first-block residual cache), ``teacache`` (accumulated modulated-input change),
``step_skip`` (fixed mask of reused steps), ``guidance_cache`` (guidance passes of chosen multistep steps
replaced by their last difference from the conditional pass) and ``stg_prefix`` (the STG pass resumes from the
conditional pass's tokens at its first perturbed block: exact) and ``fewer_steps`` (the multistep stage 1 in a
fraction of its steps, optionally with the gradient-estimation sampler). State is kept per stage, guidance pass and
stage-2 tile.
"""

from vidtune.techniques.caching import fewer_steps, first_block, guidance_cache, step_skip, stg_prefix, teacache  # noqa: F401  (registers)
