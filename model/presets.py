"""Model presets: ltx-core configuration dictionaries in the layout of a real LTX-2 checkpoint.

A preset is the ``config`` metadata a real LTX-2 safetensors file carries (keys ``transformer``,
``vae``, ``audio_vae``, ``vocoder``) plus the latent upsampler's config, and an init scale for the
seeded random weights. The same dictionaries feed ltx-core's configurators, so every preset builds
the real ltx-core classes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Preset", "PRESETS", "get_preset"]

# Keys that LTXModelConfigurator.from_config checks strictly (docs/environment.md: every checked key must
# be present with the official value).
_TRANSFORMER_FIXED: dict[str, Any] = {
    "dropout": 0.0,
    "attention_bias": True,
    "num_vector_embeds": None,
    "activation_fn": "gelu-approximate",
    "num_embeds_ada_norm": 1000,
    "use_linear_projection": False,
    "only_cross_attention": False,
    "cross_attention_norm": True,
    "double_self_attention": False,
    "upcast_attention": False,
    "standardization_norm": "rms_norm",
    "norm_elementwise_affine": False,
    "qk_norm": "rms_norm",
    "positional_embedding_type": "rope",
    "use_audio_video_cross_attention": True,
    "share_ff": False,
    "av_cross_ada_norm": True,
    "use_middle_indices_grid": True,
    # Without a Gemma encoder the stand-in context already has the transformer's width, so the
    # caption projection lives "before the connector" (i.e. outside the transformer).
    "caption_proj_before_connector": True,
    "rope_type": "split",
    "frequencies_precision": "float64",
    "positional_embedding_theta": 10000.0,
    "positional_embedding_max_pos": [20, 2048, 2048],
    "audio_positional_embedding_max_pos": [20],
    "timestep_scale_multiplier": 1000,
    "av_ca_timestep_scale_multiplier": 1000,
    "in_channels": 128,
    "out_channels": 128,
    "audio_in_channels": 128,
    "audio_out_channels": 128,
    "norm_eps": 1e-6,
}


def _transformer(layers: int, heads: int, head_dim: int, audio_heads: int, audio_head_dim: int) -> dict:
    cfg = dict(_TRANSFORMER_FIXED)
    cfg.update(
        num_layers=layers,
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        cross_attention_dim=heads * head_dim,  # text context width = video inner dim
        audio_num_attention_heads=audio_heads,
        audio_attention_head_dim=audio_head_dim,
        audio_cross_attention_dim=audio_heads * audio_head_dim,
    )
    return cfg


def _audio_vae(ch_mult: list[int], num_res_blocks: int) -> dict:
    # Audio latent: 8 channels x 16 mel bins (fixed by ltx-core's AudioLatentShape); the decoder's two
    # upsampling levels give 64 mel bins at 16 kHz / hop 160. ``ch`` must be 128: ltx-core sizes the
    # decoder's per-channel latent statistics by it, and they apply to the 8 x 16 patched latent.
    return {
        "model": {
            "params": {
                "sampling_rate": 16000,
                "ddconfig": {
                    "ch": 128,
                    "out_ch": 2,
                    "ch_mult": ch_mult,
                    "num_res_blocks": num_res_blocks,
                    "attn_resolutions": [],
                    "resolution": 256,
                    "z_channels": 8,
                    "double_z": True,
                    "in_channels": 2,
                    "norm_type": "pixel",
                    "causality_axis": "height",
                    "dropout": 0.0,
                    "mid_block_add_attention": False,
                    "mel_bins": 64,
                },
            }
        },
        "preprocessing": {"stft": {"hop_length": 160, "filter_length": 1024, "causal": True}},
    }


def _vocoder(initial_channel: int, kernel_sizes: list[int], dilations: list[list[int]]) -> dict:
    return {
        "resblock": "1",
        "stereo": True,
        "resblock_kernel_sizes": kernel_sizes,
        "resblock_dilation_sizes": dilations,
        "upsample_rates": [6, 5, 2, 2, 2],  # 240 x 100 mel frames/s = 24 kHz
        "upsample_kernel_sizes": [12, 11, 4, 4, 4],
        "upsample_initial_channel": initial_channel,
        "output_sampling_rate": 24000,
        "activation": "snake",
        "use_tanh_at_final": True,
        "use_bias_at_final": True,
    }


def _video_vae(encoder_layers: int, decoder_layers: int, base_channels: int, decoder_multiplier: int = 2) -> dict:
    # Encoder: 4x patchify, 2x space, 2x time, then 2x all twice; decoder: three 2x all + 4x unpatchify.
    # Both give the fixed LTX-2 latent grid, 32x spatial and 8x temporal (ltx_pipelines' VIDEO_SCALE_FACTORS).
    enc = [
        ["res_x", {"num_layers": encoder_layers}],
        ["compress_space_res", {"multiplier": 1}],
        ["compress_time_res", {"multiplier": 1}],
        ["compress_all_res", {"multiplier": 1}],
        ["compress_all_res", {"multiplier": 1}],
    ]
    dec = [
        ["res_x", {"num_layers": decoder_layers}],
        ["compress_all", {"multiplier": decoder_multiplier, "residual": True}],
        ["res_x", {"num_layers": decoder_layers}],
        ["compress_all", {"multiplier": decoder_multiplier, "residual": True}],
        ["res_x", {"num_layers": decoder_layers}],
        ["compress_all", {"multiplier": decoder_multiplier, "residual": True}],
        ["res_x", {"num_layers": decoder_layers}],
    ]
    return {
        "dims": 3,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 128,
        "encoder_blocks": enc,
        "decoder_blocks": dec,
        "patch_size": 4,
        "norm_layer": "pixel_norm",
        "latent_log_var": "uniform",
        "spatial_padding_mode": "zeros",
        "causal_decoder": False,
        "timestep_conditioning": False,
        "decoder_base_channels": base_channels,
    }


@dataclass(frozen=True)
class Preset:
    """A named model shape with seeded random weights.

    Attributes:
        name: preset name used in configs and cache keys.
        config: the checkpoint ``config`` metadata (transformer, vae, audio_vae, vocoder).
        upsampler_config: the latent upsampler's config (a separate file in real LTX-2 releases).
        init_std: std of the random linear/conv weights; chosen so that knobs visibly change output.
        stg_blocks: transformer blocks whose self-attention the STG guidance pass skips.
        weight_seed: seed of the random weights (same preset + seed -> same model).
    """

    name: str
    config: dict
    upsampler_config: dict
    init_std: float
    stg_blocks: tuple[int, ...]
    weight_seed: int = 0
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def copy_config(self) -> dict:
        """Return a deep copy of the checkpoint config (safe to mutate)."""
        return copy.deepcopy(self.config)


PRESETS: dict[str, Preset] = {
    # Runs a 256x384x17 two-stage request in seconds on 2 CPU cores. init_std 0.2: docs/environment.md
    # measured that at 0.05 the transformer barely moves the latents (knobs look free).
    "tiny": Preset(
        name="tiny",
        config={
            "transformer": _transformer(layers=2, heads=2, head_dim=32, audio_heads=2, audio_head_dim=16),
            "vae": _video_vae(encoder_layers=1, decoder_layers=1, base_channels=8),
            "audio_vae": _audio_vae(ch_mult=[1, 1, 1], num_res_blocks=1),
            "vocoder": _vocoder(32, [3], [[1, 3, 5]]),
        },
        upsampler_config={
            "in_channels": 128,
            "mid_channels": 32,
            "num_blocks_per_stage": 1,
            "dims": 3,
            "spatial_upsample": True,
            "temporal_upsample": False,
        },
        init_std=0.2,
        stg_blocks=(1,),
        notes="random seeded weights; quality behaviour is not a trained model's",
    ),
    # The real LTX-2 19B transformer shape (48 blocks, video 32x128, audio 32x64). VAE, upsampler and
    # vocoder are sized like the released ones but not copied from a checkpoint: latency claims
    # for this preset are about the transformer.
    "ltx2-19b": Preset(
        name="ltx2-19b",
        config={
            "transformer": _transformer(layers=48, heads=32, head_dim=128, audio_heads=32, audio_head_dim=64),
            "vae": _video_vae(encoder_layers=4, decoder_layers=5, base_channels=128),
            "audio_vae": _audio_vae(ch_mult=[1, 2, 4], num_res_blocks=2),
            "vocoder": _vocoder(1024, [3, 7, 11], [[1, 3, 5], [1, 3, 5], [1, 3, 5]]),
        },
        upsampler_config={
            "in_channels": 128,
            "mid_channels": 1024,
            "num_blocks_per_stage": 4,
            "dims": 3,
            "spatial_upsample": True,
            "temporal_upsample": False,
        },
        init_std=0.02,
        stg_blocks=(29,),
        notes="real 19B transformer shape, random weights: latency only",
        extra={"context_tokens": 1024},  # the Gemma connector's output length in LTX-2
    ),
    # A small model of the same architecture, trained by vidtune on procedural clips (model/mini/):
    # shapes bouncing over a textured background with synchronised hums and clicks. Its weights are
    # shipped (model/mini/weights/, <= 20 MB in bf16) and load through the checkpoint path; the text
    # path is vidtune's own small encoder (model/mini/text_encoder.py). Sized for the CPU: a
    # 256x384x33 two-stage request (480 stage-2 tokens) in well under a minute on 2 cores.
    "ltx2-mini": Preset(
        name="ltx2-mini",
        config={
            "transformer": _transformer(layers=3, heads=4, head_dim=32, audio_heads=4, audio_head_dim=32),
            # Decoder: 32 channels at every level (ltx-core starts at 8 x base and divides by the
            # multiplier per upsampling; multiplier 1 keeps them). The released shape's halving (base 8:
            # 64 -> 8 channels) starved the full-resolution layers: overfitting two clips on the CPU,
            # 24.4 dB after 450 steps against 30.8 dB for this one, with fewer parameters (1.04 M).
            "vae": _video_vae(encoder_layers=1, decoder_layers=1, base_channels=4, decoder_multiplier=1),
            "audio_vae": _audio_vae(ch_mult=[1, 1, 1], num_res_blocks=1),
            "vocoder": _vocoder(96, [3, 7], [[1, 3, 5], [1, 3, 5]]),
        },
        upsampler_config={
            "in_channels": 128,
            "mid_channels": 32,
            "num_blocks_per_stage": 1,
            "dims": 3,
            "spatial_upsample": True,
            "temporal_upsample": False,
        },
        init_std=0.02,
        stg_blocks=(1,),
        notes="trained on procedural shapes/tones clips by vidtune (model/mini/train.py)",
        extra={"context_tokens": 24, "trained": True},
    ),
}


def get_preset(name: str) -> Preset:
    """Return the preset called ``name``.

    Raises:
        ValueError: naming the field ``model.preset`` and the allowed values.
    """
    if name not in PRESETS:
        raise ValueError(f"model.preset must be one of {sorted(PRESETS)} (or checkpoint=<path>), got {name!r}")
    return PRESETS[name]
