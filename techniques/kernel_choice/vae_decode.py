"""The video VAE decode's kernels: compiled decoder blocks, channels-last 3D convolutions, cuDNN autotuning.

The decode is the stage no other technique touches: 1.85 s of a 12.1 s baseline at 1536x1024x121 and
10.6 s of 85.7 s at 3840x2176x121 on the H200 (whole_generation README). It is convolutions (3x3x3 over
up to 128 channels at full resolution) with pixel norms, SiLUs and paddings between them, each of those
a full pass over the activation in eager mode. Knobs (the tile sizes are ``tiling.vae_tiles``):

- ``compile``: each of the decoder's up blocks, and its input and output convolutions, compiled by
  Inductor (norm, activation and padding fused around cuDNN's convolution), with dynamic shapes: the
  tiled decode's tiles differ in size at the video's edges, and one graph per module serves them all.
  A block that injects noise (it takes the decode's generator) stays eager: a generator in a graph
  would be guarded on by identity, and every decode makes a new one.
- ``channels_last``: the decoder's 5-D weights in ``channels_last_3d`` (NDHWC), so cuDNN runs its
  channels-last convolutions (the layout Hopper's tensor-core kernels read); restored on undo.
- ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark`` on during the decode only: cuDNN times its
  algorithms once per convolution shape and keeps the fastest (the first decode of a shape pays it).

None of them is exact on a GPU (another convolution algorithm or a fused norm rounds differently), and
only the cuDNN setting is a no-op on a CPU.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vidtune.techniques.kernel_choice import compile_cache
from vidtune.techniques.registry import Knob, Patch, Technique, register

_MODES = ("off", "default", "max-autotune-no-cudagraphs")


def _injects_noise(module: torch.nn.Module) -> bool:
    return any(getattr(m, "inject_noise", False) for m in module.modules())


def compiled_modules(decoder: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The decoder modules ``compile`` compiles: the up blocks that take no generator, the two
    convolutions around them."""
    out = [("conv_in", decoder.conv_in)]
    out += [(f"up_blocks.{i}", b) for i, b in enumerate(decoder.up_blocks) if not _injects_noise(b)]
    return out + [("conv_out", decoder.conv_out)]


def _without_generator(compiled: Any) -> Any:
    def forward(*args: Any, generator: Any = None, **kwargs: Any) -> Any:
        return compiled(*args, **kwargs)  # (the module injects no noise: the generator is unused)

    return forward


@register("kernel_choice.vae_decode")
class VAEDecode(Technique):
    """Faster kernels for the video VAE decode."""

    knobs = (
        Knob("compile", "categorical", off="off", choices=_MODES,
             help="torch.compile the decoder's up blocks and convolutions (dynamic shapes), or not"),
        Knob("channels_last", "bool", off=False, help="decoder weights in channels_last_3d (NDHWC convolutions)"),
        Knob("cudnn_benchmark", "bool", off=False, help="cuDNN algorithm autotuning during the decode"),
    )
    stages = ("decode_video",)
    seams = ("decode.video", "decoder.modules")
    # (tiling.vae_tiles decides the shapes the decoder meets, in another seam; compiled with dynamic shapes
    # and cuDNN tuning each shape, any tiling goes with these knobs)
    description = "video VAE decode: compiled decoder blocks, channels-last 3D convolutions, cuDNN autotuning"
    inexact = ("another convolution algorithm, layout or fused norm rounds differently on a GPU (on a CPU only "
               "cudnn_benchmark is a no-op, and neutral offers it there)")

    def compiles(self, values: Mapping[str, Any]) -> bool:
        return values.get("compile", "off") != "off"

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        # cuDNN does not run on a CPU: the wrapper is installed and the arithmetic unchanged
        return {"cudnn_benchmark": True} if torch.device(device).type == "cpu" else None

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        decoder = pipeline.models.video_decoder
        patch = Patch(self.name)
        if values["compile"] != "off":
            mode = None if values["compile"] == "default" else values["compile"]
            for _, module in compiled_modules(decoder):
                patch.set_attr(module, "forward", _without_generator(torch.compile(module.forward, mode=mode, dynamic=True)))
            pipeline.applied_info[self.name] = {"compile": values["compile"], "channels_last": values["channels_last"]}
            patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
            compile_cache.attach(pipeline, self.name, patch)
        if values["channels_last"]:
            weights = [p for p in decoder.parameters() if p.dim() == 5 and not p.is_contiguous(memory_format=torch.channels_last_3d)]
            for p in weights:
                p.data = p.data.contiguous(memory_format=torch.channels_last_3d)
            patch.touched.append((decoder, "weight_layout"))

            def restore() -> None:
                for p in weights:
                    p.data = p.data.contiguous()

            patch.on_undo(restore)
        if values["cudnn_benchmark"]:
            decode = pipeline.decode_video

            def decode_video(video_latent: torch.Tensor, rng_state: torch.Tensor) -> torch.Tensor:
                before = torch.backends.cudnn.benchmark
                torch.backends.cudnn.benchmark = True
                try:
                    return decode(video_latent, rng_state)
                finally:
                    torch.backends.cudnn.benchmark = before

            patch.set_attr(pipeline, "decode_video", decode_video)
        return patch
