"""A lower bound of the memory a request needs, from the model's shape: checked before any model is built.

A request far too large for the machine (99968x99968 was accepted) used to fail on memory 36 s into the
run, after the model was built. The bound counts only what cannot be avoided, so it refuses only requests
that cannot fit: the transformer's weights (the linear layers of the video and audio streams and their
cross-attentions, from the config), stage 1's activations (stage 1 runs the whole half-resolution latent
at once: the block's input, its normalised copy, q, k, v and the attention output, 6 x tokens x width,
in the pipeline's dtype), and, in host memory, the uint8 frames of the output.
"""

from __future__ import annotations

from typing import Any

_BUFFERS = 6  # hidden states alive together inside one block (see above): a floor, the real peak is higher


def transformer_config(source: Any) -> dict[str, Any]:
    """The transformer config of a model source (a preset's, or a checkpoint's ``config`` metadata)."""
    import json

    if source.preset is not None:
        from vidtune.model.presets import get_preset

        return dict(get_preset(source.preset).config["transformer"])
    from safetensors import safe_open

    with safe_open(source.checkpoint, framework="pt") as f:
        return dict(json.loads((f.metadata() or {})["config"])["transformer"])


def lower_bound_bytes(config: dict[str, Any], request: Any, dtype_bytes: int = 2) -> dict[str, int]:
    """Bytes the request needs at the least: ``device`` (weights + stage-1 activations) and ``host`` (frames)."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    da = config["audio_num_attention_heads"] * config["audio_attention_head_dim"]
    dc, dac = config["cross_attention_dim"], config.get("audio_cross_attention_dim", config["cross_attention_dim"])
    # per block: self-attention 4 d^2 and a 4x MLP 8 d^2 per stream, text cross-attention q/o and k/v,
    # and the audio <-> video cross-attentions
    per_layer = 12 * d * d + 12 * da * da + 2 * d * d + 2 * d * dc + 2 * da * da + 2 * da * dac + 4 * d * da
    weights = config["num_layers"] * per_layer * dtype_bytes
    h1, w1 = request.stage1_shape
    tokens1 = ((request.frames - 1) // 8 + 1) * (h1 // 32) * (w1 // 32)
    activations = _BUFFERS * tokens1 * d * dtype_bytes
    return {"device": weights + activations, "weights": weights, "stage1_activations": activations,
            "host": request.frames * request.height * request.width * 3}


def device_memory_bytes(device: str) -> int:
    """Total memory of ``device`` (a CUDA GPU's, or the host's physical memory for the CPU)."""
    import os

    if str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[1])
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def host_memory_bytes() -> int:
    return device_memory_bytes("cpu")
