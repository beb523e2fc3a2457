"""The reference LTX-2 pipeline (built from ltx-core 1.0.0 components) and its presets."""

from vidtune.model.loading import ModelSource, Models, load_models
from vidtune.model.pipeline import ATTENTION_KINDS, STAGES, GenerationOutput, ReferencePipeline, StageLatents, StepContext
from vidtune.model.presets import PRESETS, Preset, get_preset
from vidtune.model.request import GenerationRequest, RequestError
from vidtune.model.tiles import Stage2Tiling

__all__ = [
    "ATTENTION_KINDS",
    "GenerationOutput",
    "GenerationRequest",
    "ModelSource",
    "Models",
    "PRESETS",
    "Preset",
    "ReferencePipeline",
    "RequestError",
    "STAGES",
    "Stage2Tiling",
    "StageLatents",
    "StepContext",
    "get_preset",
    "load_models",
]
