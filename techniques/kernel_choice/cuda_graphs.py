"""CUDA graphs: each transformer block captured once per input signature and replayed.

A block's launch sequence (tens of small kernels for AdaLN, norms, gates between the GEMMs and
attentions) is replayed from a graph, removing CPU launch overhead. Capture is per block and per
signature (shapes and dtypes of every tensor input, plus the perturbation set of the guidance pass),
so it survives the caching techniques (they decide between blocks) and guidance passes (STG changes
what a block runs). Needs the weights resident on a CUDA device; on a CPU the technique does nothing
and says so in the trial record.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import torch

from vidtune.techniques.kernel_choice.compile import installed_callables
from vidtune.techniques.registry import Knob, Patch, Technique, register


def _flatten(args: Any) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any], tuple]:
    """Tensor leaves of a TransformerArgs (or None), a rebuild function, and a hashable signature."""
    if args is None:
        return [], lambda leaves: None, ("none",)
    leaves: list[torch.Tensor] = []
    spec: list[tuple] = []
    sig: list[Any] = []
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, torch.Tensor):
            spec.append((f.name, "t", len(leaves)))
            leaves.append(value)
            sig.append((f.name, tuple(value.shape), value.dtype))
        elif isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            spec.append((f.name, "seq", len(leaves), len(value), type(value)))
            sig.append((f.name, tuple((tuple(v.shape), v.dtype) for v in value)))
            leaves.extend(value)
        else:
            spec.append((f.name, "v", value))
            sig.append((f.name, "v", value if isinstance(value, (bool, int, float, str, type(None))) else id(value)))

    def rebuild(new: list[torch.Tensor]) -> Any:
        kwargs = {}
        for entry in spec:
            if entry[1] == "t":
                kwargs[entry[0]] = new[entry[2]]
            elif entry[1] == "seq":
                kwargs[entry[0]] = entry[4](new[entry[2]:entry[2] + entry[3]])
            else:
                kwargs[entry[0]] = entry[2]
        return type(args)(**kwargs)

    return leaves, rebuild, tuple(sig)


def _fingerprint(block: torch.nn.Module) -> tuple:
    """The callables a block's computation goes through (overridden forwards, attention functions).

    Other techniques change a block by replacing these (FP8 linears, SDPA backends); a graph captured
    before such a change must not be replayed after it. Objects are compared by identity and held by
    the cache entry, so an id can never be reused by a different object.
    """
    return tuple(installed_callables(m) for m in block.modules())


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x[0] is y[0] and x[1] is y[1] for x, y in zip(a, b))


def _perturbation_key(perturbations: Any) -> Any:
    if perturbations is None:
        return None
    return tuple(tuple((p.type, tuple(p.blocks) if p.blocks is not None else None) for p in cfg.perturbations)
                 for cfg in perturbations.perturbations)


class SharedInputs:
    """Static input buffers shared by every block's graphs (positions, contexts, timesteps).

    All blocks of a pass read the same positional embeddings, contexts and timestep embeddings; one
    static copy serves them all (per-block copies of the RoPE tables alone took 38 GB at 24k tokens
    and ran the H200 out of memory). A buffer is refreshed only when its source tensor changes: the
    last source is held (so its memory cannot be reused by another tensor) and compared by identity
    (and version counter where the tensor has one; inference-mode tensors have none, and the pipeline
    never modifies a pass's positions, contexts or timestep embeddings in place).
    """

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.sources: dict[tuple, tuple[torch.Tensor, int]] = {}

    def bind(self, key: tuple, src: torch.Tensor) -> torch.Tensor:
        if key not in self.buffers:
            self.buffers[key] = src.clone()
            self.sources[key] = (src, _version(src))
        return self.buffers[key]

    def refresh(self, key: tuple, src: torch.Tensor) -> None:
        last = self.sources.get(key)
        if last is None or last[0] is not src or last[1] != _version(src):
            self.buffers[key].copy_(src)
            self.sources[key] = (src, _version(src))


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors do not track a version counter
        return -1


class BlockGraphs:
    """Per-signature CUDA graphs of one block's forward."""

    def __init__(self, block: torch.nn.Module, pool: Any, shared: SharedInputs) -> None:
        self.block = block
        self.forward = type(block).forward.__get__(block)
        self.pool = pool
        self.shared = shared
        self.graphs: dict[tuple, tuple] = {}

    def __call__(self, video: Any = None, audio: Any = None, perturbations: Any = None) -> tuple[Any, Any]:
        vl, vrebuild, vsig = _flatten(video)
        al, arebuild, asig = _flatten(audio)
        key = (vsig, asig, _perturbation_key(perturbations))
        leaves = vl + al
        fingerprint = _fingerprint(self.block)
        entry = self.graphs.get(key)
        if entry is None or not _same(entry[0], fingerprint):
            entry = (fingerprint, *self._capture(key, leaves, len(vl), vrebuild, arebuild, perturbations))
            self.graphs[key] = entry
        _, graph, static_in, token_slots, shared_keys, static_out = entry
        for i, src in enumerate(leaves):
            if i in token_slots:
                static_in[i].copy_(src)
            else:
                self.shared.refresh(shared_keys[i], src)
        graph.replay()
        v_out, a_out = static_out
        # the next replay overwrites the static outputs: hand out copies of the tokens
        return (dataclasses.replace(v_out, x=v_out.x.clone()) if v_out is not None else None,
                dataclasses.replace(a_out, x=a_out.x.clone()) if a_out is not None else None)

    def _capture(self, key, leaves, n_video, vrebuild, arebuild, perturbations):
        # token tensors (``x``) are per block; everything else is shared across blocks
        video_x = 0 if n_video else None
        audio_x = n_video if len(leaves) > n_video else None
        token_slots = {i for i in (video_x, audio_x) if i is not None}
        shared_keys = {i: (key[0] if i < n_video else key[1], i < n_video, i) for i in range(len(leaves))}
        static_in = [src.clone() if i in token_slots else self.shared.bind(shared_keys[i], src)
                     for i, src in enumerate(leaves)]

        def call():
            return self.forward(video=vrebuild(static_in[:n_video]), audio=arebuild(static_in[n_video:]),
                                perturbations=perturbations)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the graph (lazy inits, cuBLAS workspaces, autotuning)
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = call()
        return graph, static_in, token_slots, shared_keys, static_out


# Captured graphs live as long as the model, or until ``release``: re-applying the technique (every interleaved
# repeat of a trial) replays them instead of capturing again. A worker releases them before a setting without
# this technique and after a failure: at 1536x1024x121 on ltx2-19b a capture that ran out of memory left 19.6 GiB
# held here, and every later run of that process ran out of memory too (H100, 2026-12-07).
_RUNNERS: "weakref.WeakKeyDictionary[torch.nn.Module, list[BlockGraphs]]" = weakref.WeakKeyDictionary()


@register("kernel_choice.cuda_graphs")
class CudaGraphs(Technique):
    """Replay each transformer block from a CUDA graph captured per input signature."""

    knobs = (Knob("enabled", "bool", off=False, help="capture and replay the blocks as CUDA graphs"),)
    switch = "enabled"
    stages = ("stage1", "stage2")
    # Same seam as kernel_choice.compile: compiling a graph-replaying block (or graphing a compiled
    # one) is neither; torch.compile's own "reduce-overhead" mode is the way to get both.
    # It also replaces each block's ``forward`` (the graph runner), as fused_norms does: not both.
    seams = ("blocks.call", "blocks.forward")
    description = "per-block CUDA graph capture and replay (weights GPU-resident)"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        # replaying captured kernels is the same arithmetic (on a CPU the technique records that it is inactive)
        return {"enabled": True}

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        block_lists = [t.velocity_model.transformer_blocks for t in pipeline.transformers()]
        on_cuda = pipeline.device.type == "cuda" and all(p.is_cuda for bl in block_lists for p in bl.parameters())
        if not on_cuda:
            info = {"active": False, "reason": "CUDA graphs need the transformer's weights on a CUDA device"}
        else:
            count = 0
            for blocks in block_lists:
                runners = _RUNNERS.get(blocks)
                if runners is None:
                    pool, shared = torch.cuda.graph_pool_handle(), SharedInputs()
                    runners = [BlockGraphs(b, pool, shared) for b in blocks]
                    _RUNNERS[blocks] = runners
                for block, runner in zip(blocks, runners):
                    patch.set_attr(block, "forward", runner)
                count += len(runners)
            info = {"active": True, "blocks": count}
        pipeline.applied_info[self.name] = info
        patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
        return patch

    def release(self) -> None:
        _RUNNERS.clear()
