"""Tiling family: the stage-2 tile grid and overlap, and the video VAE's decode tiles."""

from vidtune.techniques.tiling import stage2_tiles, vae_tiles  # noqa: F401  (registers)
