"""A trial worker that owns several ranks, so a campaign can search the parallelism family.

``ParallelTrialWorker(spec, ranks)`` is rank 0 of a process group it creates: it starts ``ranks - 1``
helper processes on this machine (one GPU each under NCCL, else gloo on the CPU, rendezvous on
127.0.0.1), each building the same pipeline. For every call, rank 0 broadcasts the command and the
setting; all ranks run the same evaluation (SPMD) and rank 0's record is returned, with its latency
measured across the whole group. Settings are validated identically on every rank before any
collective (an invalid degree fails everywhere at once: no rank waits for another). As a Ray actor it
asks Ray for ``ranks`` GPUs (or CPUs); killing it (a timed-out trial) ends its helpers too: they
exit when rank 0's process group breaks.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from vidtune._compat import usable_cores
from vidtune.search.worker import TrialWorker, WorkerSpec

if TYPE_CHECKING:
    from vidtune.techniques.setting import SettingLike

__all__ = ["ParallelTrialWorker"]


def _helper_main(rank: int, world: int, port: int, spec: WorkerSpec, backend: str, timeout_s: float,
                 state: Any) -> None:
    """A helper rank: build the pipeline, then run whatever rank 0 broadcasts until told to stop."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from vidtune._compat import enter_creator_state
    from vidtune.techniques.parallelism.distributed import join_local_world, leave_world

    enter_creator_state(state)
    torch.set_num_threads(max(1, usable_cores() // world))
    device = join_local_world(rank, world, port, backend, timeout_s)
    worker = TrialWorker(dataclasses.replace(spec, device=device, progress_file="", quality=None))
    try:
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            command, args = box[0]
            if command == "stop":
                break
            getattr(worker, command)(*args)  # the record of a helper is not needed: rank 0 reports
    finally:
        leave_world()


class ParallelTrialWorker(TrialWorker):
    """Rank 0 of ``ranks`` processes evaluating each setting together (see the module docstring)."""

    def __init__(self, spec: WorkerSpec, ranks: int, timeout_s: float = 1800.0) -> None:
        from vidtune._compat import child_context, creator_state
        from vidtune.techniques.parallelism.distributed import free_port, join_local_world

        if ranks < 2:
            raise ValueError(f"ray.ranks_per_actor must be >= 2 for a parallel worker, got {ranks}")
        # every rank runs the same sequence of runs: adaptive repeats decide on each rank's own timings,
        # which differ, and a rank that stopped early would leave the others waiting in a collective
        spec = dataclasses.replace(spec, max_repeats=spec.repeats)
        backend = "nccl" if spec.device.startswith("cuda") else "gloo"
        port = free_port()
        ctx, state = child_context(), creator_state()  # (without CUDA: forked from a server that imported torch)
        self._helpers = [ctx.Process(target=_helper_main, args=(r, ranks, port, spec, backend, timeout_s, state),
                                     daemon=True) for r in range(1, ranks)]
        for p in self._helpers:
            p.start()
        import torch

        torch.set_num_threads(max(1, usable_cores() // ranks))
        device = join_local_world(0, ranks, port, backend, timeout_s)
        super().__init__(dataclasses.replace(spec, device=device))
        self.ranks = ranks

    def _broadcast(self, command: str, *args: Any) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list([(command, args)], src=0)

    def evaluate(self, knobs: SettingLike, scoped: bool = True, repeats: int | None = None,
                 screen: Any = None, front: Any = None) -> dict[str, Any]:
        # (no screen, no prune: the helper ranks run the same timed runs in lockstep, and only this rank sees the
        # quality; a stop on this rank alone would leave them waiting)
        self._broadcast("evaluate", knobs, scoped, repeats)
        record = super().evaluate(knobs, scoped, repeats)
        record["ranks"] = self.ranks
        return record

    def bench(self, knobs: SettingLike, repeats: int, out_dir: str | None = None,
              rewarm: bool = True, reference: str = "stored",
              others: dict[str, SettingLike] | None = None, out_dirs: dict[str, str] | None = None) -> dict[str, Any]:
        # (each rank runs its own reference)
        self._broadcast("bench", knobs, repeats, None, rewarm, reference, others)
        return super().bench(knobs, repeats, out_dir, rewarm, reference, others, out_dirs)

    def ensure_baseline(self) -> dict[str, Any]:
        # All ranks run the all-off baseline (no collectives inside); rank 0 stores or reuses it, and
        # the helpers then find it on disk under the same key.
        info = super().ensure_baseline()
        self._broadcast("_load_baseline")
        return info

    def close(self) -> None:
        """Stop the helpers and leave the process group."""
        from vidtune.techniques.parallelism.distributed import leave_world

        if getattr(self, "_helpers", None) is None:
            return
        self.wait_baseline_files()
        self._broadcast("stop")
        for p in self._helpers:
            p.join(timeout=60)
        self._helpers = None
        leave_world()
