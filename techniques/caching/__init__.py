"""Caching family: reuse transformer work across denoising steps (first-block cache, TeaCache,
step skipping). Techniques land with issue "Technique families I"; the family is declared here so the
registry, CLI and campaign know it."""
