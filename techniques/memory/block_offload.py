"""Block offload: some transformer blocks keep their weights in host memory (pinned on CUDA) and are copied to
the device just before they run, on a side stream, ``prefetch`` blocks ahead, so that the copy of the next
blocks overlaps the compute of this one; after a block has run its device copy is dropped. The device then
holds the resident blocks plus at most ``prefetch + 1`` offloaded ones, instead of every block (the 19B's 48
blocks are ~38 GB in bf16: the rest of the pipeline fits a 24 GB card only with most of them streamed).

The idea is the streamed-block engines' (LTX's own low-memory guide; double buffering on a side stream with
events); the code is vidtune's. The offloaded blocks are spread evenly over the depth, so that each copy has
the resident blocks between two offloaded ones to hide behind. The copies are exact, so the output is
bit-identical to the resident model (tests/test_memory.py, with the copy path exercised on the CPU, where the
"device" copy is a second host tensor and nothing overlaps).

Stored FP8 weights (``kernel_choice.fp8_linear``, ``memory.fp8_weights``) are streamed with the rest of a block:
this technique applies last, after them, and moves whatever tensors a block holds then.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vidtune.kernels.fp8 import QuantizedWeight
from vidtune.techniques.memory.host_copies import HostSlot, empty_on, host_copy, parameter_slots
from vidtune.techniques.registry import Knob, Patch, Technique, register

__all__ = ["BlockOffload", "BlockStreamer", "offloaded_indices"]


def offloaded_indices(blocks: int, offloaded: int) -> list[int]:
    """Which of ``blocks`` blocks are offloaded: ``offloaded`` of them spread evenly over the depth (the last
    block of each even share), so that resident blocks sit between them and hide their copies."""
    offloaded = max(0, min(blocks, offloaded))
    return sorted({(i + 1) * blocks // offloaded - 1 for i in range(offloaded)}) if offloaded else []


def _slots(block: torch.nn.Module) -> list[HostSlot]:
    """Every tensor of ``block`` worth streaming: its parameters (those another technique emptied are left
    alone) and the stored FP8 weights of its linears (``vt_fp8_weight``)."""
    out = parameter_slots(block)
    for m in block.modules():
        w = m.__dict__.get("vt_fp8_weight")
        if isinstance(w, QuantizedWeight):
            for field in ("q", "scale", "scale_row", "bias"):
                value = getattr(w, field)
                if value is None:
                    continue

                def put(t: torch.Tensor, w: QuantizedWeight = w, field: str = field) -> None:
                    setattr(w, field, t)
                    if field == "q":
                        w.q_t = t.t() if t.dim() == 2 else t  # (q_t is a view of q: it follows)

                out.append(HostSlot(host_copy(value), put))
    return out


class BlockStreamer:
    """The offloaded blocks of one transformer, in the order they run, and their copies to the device.

    ``before(k)`` runs as offloaded block ``k`` starts: its weights are made present (copied now if no
    prefetch brought them), the compute stream waits for their copy event, and the next ``prefetch``
    offloaded blocks (cyclically: after the last one the next pass starts again at the first) are copied on
    the side stream; blocks loaded but outside that window (a cache skipped them) are dropped. ``after(k)``
    drops block ``k``'s device copy. On CUDA each copied tensor is marked used on the compute stream
    (``record_stream``), so the allocator does not hand its memory out again before that compute is done.
    ``on_copy(bytes, waited)`` hears of every block copied (``waited``: the block was about to run, its copy
    not hidden behind earlier compute).
    """

    def __init__(self, slots: list[list[HostSlot]], device: torch.device, prefetch: int,
                 on_copy: Callable[[int, bool], None] = lambda nbytes, waited: None) -> None:
        self.slots, self.device, self.on_copy = slots, device, on_copy
        self.prefetch = max(0, min(prefetch, len(slots) - 1))
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.loaded: dict[int, list[torch.Tensor]] = {}  # block -> its device tensors
        self.events: dict[int, Any] = {}  # block -> its copy's event, until the compute stream waited for it
        self.nbytes = [sum(s.host.numel() * s.host.element_size() for s in block) for block in slots]

    def drop_all(self) -> None:
        """Every offloaded block's device copy dropped (and the weights the model held replaced by empties)."""
        for k, block in enumerate(self.slots):
            self._drop(k)
            for s in block:
                s.put(empty_on(s.host, self.device))

    def _load(self, k: int, waited: bool) -> None:
        if self.side is None:  # a CPU: the copy is a second host tensor, made now
            tensors = [s.host.clone() for s in self.slots[k]]
        else:
            self.side.wait_stream(torch.cuda.current_stream(self.device))  # (after what was queued before it)
            with torch.cuda.stream(self.side):
                tensors = [s.host.to(self.device, non_blocking=True) for s in self.slots[k]]
                event = torch.cuda.Event()
                event.record(self.side)
            self.events[k] = event
        for s, t in zip(self.slots[k], tensors):
            s.put(t)
        self.loaded[k] = tensors
        self.on_copy(self.nbytes[k], waited)

    def _drop(self, k: int) -> None:
        if self.loaded.pop(k, None) is not None:
            for s in self.slots[k]:
                s.put(empty_on(s.host, self.device))
        self.events.pop(k, None)

    def before(self, k: int) -> None:
        n = len(self.slots)
        window = {(k + j) % n for j in range(self.prefetch + 1)}
        for other in [o for o in self.loaded if o not in window]:
            self._drop(other)
        if k not in self.loaded:
            self._load(k, waited=True)
        event = self.events.pop(k, None)
        if event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            for t in self.loaded[k]:
                t.record_stream(compute)
        for j in range(1, self.prefetch + 1):
            if (k + j) % n not in self.loaded:
                self._load((k + j) % n, waited=False)

    def after(self, k: int) -> None:
        self._drop(k)

    def restore(self) -> None:
        """The resident model again: every offloaded tensor back on the device (undo)."""
        if self.side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
        self.loaded.clear()
        self.events.clear()
        for block in self.slots:
            for s in block:
                s.put(s.host.to(self.device))


@register("memory.block_offload")
class BlockOffload(Technique):
    """Stream some transformer blocks' weights from host memory ahead of their use, on a side stream."""

    knobs = (
        Knob("offloaded_blocks", "int", off=0, low=0, high=48, scales="depth",
             help="blocks of each transformer whose weights live in host memory and are copied in before they run "
                  "(spread evenly over the depth; more than the model has: all)"),
        Knob("prefetch", "int", off=1, low=1, high=4,
             help="offloaded blocks copied ahead of the one running (each costs one block's weights of device memory)"),
    )
    switch = "offloaded_blocks"
    stages = ("stage1", "stage2")
    # the blocks' weights' storage, and how a block is called (its pre- and post-forward hooks): a compiled or
    # graph-captured block would trace or replay the hooks' weight swaps, so those techniques do not compose
    seams = ("blocks.weights", "blocks.call")
    apply_last = True  # after the FP8 techniques, so that their stored weights stream too
    description = "transformer blocks' weights in (pinned) host memory, streamed in ahead of use on a side stream"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        return {"offloaded_blocks": 48, "prefetch": 1}  # (every block streamed: the copies are exact)

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)

        def on_copy(nbytes: int, waited: bool) -> None:  # per run (records are reset before each generation)
            rec = pipeline.records.setdefault("block_offload_copies", {"blocks_copied": 0, "bytes_copied": 0, "not_prefetched": 0})
            rec["blocks_copied"] += 1
            rec["bytes_copied"] += nbytes
            rec["not_prefetched"] += int(waited)

        offloaded, host_bytes = [], 0
        for transformer in pipeline.transformers():
            blocks = list(transformer.velocity_model.transformer_blocks)
            chosen = offloaded_indices(len(blocks), int(values["offloaded_blocks"]))
            if not chosen:
                continue
            device = next(p.device for p in blocks[0].parameters())
            streamer = BlockStreamer([_slots(blocks[i]) for i in chosen], device, int(values["prefetch"]), on_copy)
            streamer.drop_all()
            patch.on_undo(streamer.restore)
            for k, i in enumerate(chosen):
                pre = blocks[i].register_forward_pre_hook(lambda module, args, k=k, s=streamer: s.before(k))
                post = blocks[i].register_forward_hook(lambda module, args, out, k=k, s=streamer: s.after(k))
                patch.on_undo(pre.remove)
                patch.on_undo(post.remove)
            offloaded.append(chosen)
            host_bytes += sum(streamer.nbytes)
        pipeline.applied_info[self.name] = {"offloaded_blocks": offloaded, "prefetch": int(values["prefetch"]),
                                            "host_bytes": host_bytes}
        patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
        return patch
