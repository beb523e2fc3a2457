"""Tiling family: stage-2 tile grid and overlap, VAE spatial/temporal tiles. The seams exist in the
reference pipeline (``ReferencePipeline.stage2_tiling`` and ``vae_tiling``); techniques land with issue
"Technique families I"."""
