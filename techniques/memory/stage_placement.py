"""Stage placement: the components other than the transformer (the latent upsampler with the video encoder's
statistics, the video VAE decoder, the audio decoder and vocoder) keep their weights in host memory (pinned on
CUDA) and are on the device only while their stage runs; and the official pipeline's memory cleanup between
stages (``cleanup``: the allocator's cached blocks handed back after each placed stage) as a knob.

On a card that holds the transformer only just (or streams it, ``memory.block_offload``), the decoder's weights
and the cache the denoising left behind are what the decode's peak adds; on a large card both knobs cost a
copy or the allocator's re-growth and a search keeps them off. The copies are exact: the output is
bit-identical (tests/test_memory.py). Weights come back from their host copy on every call (nothing is copied
back: they do not change).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vidtune.techniques.memory.host_copies import HostSlot, empty_on, parameter_slots
from vidtune.techniques.registry import Knob, Patch, Technique, register

__all__ = ["StagePlacement"]

# pipeline method -> the components (attributes of ``pipeline.models``) it uses, and the knob that places them
_PLACED = {
    "upsample": ("upsampler", ("upsampler", "video_encoder")),
    "decode_video": ("decoders", ("video_decoder",)),
    "decode_audio": ("decoders", ("audio_decoder", "vocoder")),
}


@register("memory.stage_placement")
class StagePlacement(Technique):
    """Keep the upsampler and the decoders in host memory except while their stage runs; clean up after it."""

    knobs = (
        Knob("upsampler", "bool", off=False, help="the latent upsampler (and the encoder's statistics) on the device "
                                                  "only during the upsample"),
        Knob("decoders", "bool", off=False, help="the video decoder, audio decoder and vocoder on the device only "
                                                 "during their decode"),
        Knob("cleanup", "bool", off=False, help="empty the allocator's cache after each of those stages (the "
                                                "official pipelines' cleanup between stages)"),
    )
    stages = ("upsample", "decode_video", "decode_audio")
    seams = ("upsample", "decode.video", "decode.audio")
    composes_with = {"kernel_choice.vae_decode": "placement applies after it (name order) and wraps its decode "
                                                 "outermost, moving only the decoder's weights around the call: their "
                                                 "layout and what was compiled stay as it set them"}
    description = "upsampler and decoders on the device only while their stage runs; cache cleanup between stages"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        return {"upsampler": True, "decoders": True, "cleanup": True}  # (exact copies: every setting is neutral)

    def stages_for(self, values: dict[str, Any]) -> tuple[str, ...]:
        if values["cleanup"]:
            return self.stages
        return tuple(s for s in self.stages if values[_PLACED[s][0]])

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        moved = {"placed_bytes": 0, "components": []}
        for method, (knob, names) in _PLACED.items():
            placed = values[knob]
            if not placed and not values["cleanup"]:
                continue
            slots: list[HostSlot] = []
            if placed:
                for name in names:
                    module = getattr(pipeline.models, name, None)
                    if module is None or name in moved["components"]:
                        continue
                    slots += parameter_slots(module, buffers=True)
                    moved["components"].append(name)
                device = pipeline.device
                for s in slots:
                    s.put(empty_on(s.host, device))
                patch.on_undo(lambda slots=slots, device=device: [s.put(s.host.to(device)) for s in slots])
                moved["placed_bytes"] += sum(s.host.numel() * s.host.element_size() for s in slots)
            patch.set_attr(pipeline, method, self._wrap(getattr(pipeline, method), slots, pipeline.device,
                                                        values["cleanup"]))
        pipeline.applied_info[self.name] = moved
        patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
        return patch

    @staticmethod
    def _wrap(stage: Callable[..., Any], slots: list[HostSlot], device: torch.device, cleanup: bool) -> Callable[..., Any]:
        def placed(*args: Any, **kwargs: Any) -> Any:
            for s in slots:
                s.put(s.host.to(device, non_blocking=True))
            try:
                return stage(*args, **kwargs)
            finally:
                for s in slots:  # (the compute stream orders the next allocation after this stage's work)
                    s.put(empty_on(s.host, device))
                if cleanup and torch.device(device).type == "cuda":
                    torch.cuda.empty_cache()

        return placed
