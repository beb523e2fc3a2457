"""Process groups, collectives and a local launcher shared by the parallelism techniques.

Every parallel technique runs SPMD: each rank builds the same pipeline, applies the same setting and
runs the same request; the technique splits the work inside and exchanges results, so that every rank
ends with the same output (rank 0 writes it). The world comes from ``torch.distributed`` (NCCL on
GPUs, gloo on CPU); ``launch`` starts a local world of processes bound to 127.0.0.1 (tests, and
``vidtune generate --nproc``); under ``torchrun`` the CLI joins the world torchrun describes.
"""

from __future__ import annotations

import os
import socket
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from vidtune._compat import usable_cores
from vidtune.techniques.registry import KnobError

__all__ = ["RankGroup", "rank_group", "require_world", "plan_world", "planned_world", "join_local_world", "leave_world", "feasible_degrees", "suggest_with_feasible_degree", "world_size", "broadcast_tensor", "all_gather_cat", "all_to_all",
           "all_reduce_sum", "launch", "init_from_env", "free_port"]


# The world a launcher is about to start (``--nproc``, a campaign's ranks per actor), read when settings are
# validated before any rank exists. A context variable, set only through plan_world / planned_world: a thread
# or task sees its own plan, and a block's plan is undone after it.
_PLANNED: ContextVar[int | None] = ContextVar("vidtune_planned_world", default=None)


def plan_world(n: int) -> None:
    """Declare the world a launcher is about to start, so settings are validated before it starts (for the rest
    of this context: the command line's ``--nproc``)."""
    _PLANNED.set(n)


@contextmanager
def planned_world(n: int) -> Iterator[None]:
    """``plan_world(n)`` for a block; the earlier plan (or none) comes back after it, so a campaign run in a
    longer-lived process (a notebook, a test session) leaves no world behind for later validation."""
    token = _PLANNED.set(n)
    try:
        yield
    finally:
        _PLANNED.reset(token)


def world_size() -> int:
    """Processes in the default group; before it exists, the planned world (``--nproc``, or torchrun's
    WORLD_SIZE), else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    planned = _PLANNED.get()
    if planned is not None:
        return planned
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass(frozen=True)
class RankGroup:
    """The ``degree`` ranks that share one parallel job, and this process's place among them."""

    group: Any
    rank: int  # rank within the group
    size: int
    ranks: tuple[int, ...]  # global ranks of the group, in group order


_GROUPS: dict[tuple[int, int], RankGroup] = {}


def require_world(knob: str, degree: int) -> None:
    """Raise ``KnobError`` naming ``knob`` unless the world can hold ``degree`` (no collective: never hangs)."""
    world = world_size()
    if degree > world or world % degree:
        how = "this is one process" if world == 1 else f"the world has {world} processes"
        raise KnobError(
            f"{knob}={degree} needs a multiple of {degree} processes but {how}; "
            f"launch with `vidtune generate --nproc {degree}` or torchrun --nproc-per-node {degree}, "
            f"or choose a degree that divides {world}"
        )


def feasible_degrees(choices: tuple[int, ...]) -> list[int]:
    """The degrees among ``choices`` that the (planned) world can hold."""
    world = world_size()
    return [d for d in choices if d <= world and world % d == 0]


def suggest_with_feasible_degree(technique: Any, trial: Any) -> dict[str, Any]:
    """Optuna sample of a parallelism technique with ``degree`` limited to what the world can hold
    (the parameter's choice list is fixed for a campaign, whose world is)."""
    return technique.suggest_restricted(trial, {"degree": feasible_degrees(technique.knob("degree").choices)})


def rank_group(knob: str, degree: int) -> RankGroup:
    """The group of ``degree`` consecutive ranks this process belongs to (collective on first use).

    The world is cut into ``world / degree`` groups of consecutive ranks that each run the whole job
    (a 4-process world can evaluate a degree-2 setting twice over). Raises ``KnobError`` naming
    ``knob`` before any collective when the world cannot hold the degree, so that a bad value is an
    error, never a hang.
    """
    require_world(knob, degree)
    world = world_size()
    if not dist.is_initialized():
        raise KnobError(f"{knob}={degree}: torch.distributed is not initialised; start the processes with "
                        f"`vidtune generate --nproc {degree}` or torchrun")
    key = (world, degree)
    if key not in _GROUPS:
        me = dist.get_rank()
        mine = None
        if degree == world:
            mine = RankGroup(dist.group.WORLD, me, world, tuple(range(world)))
        else:
            # new_group is collective over the whole world: every rank creates every group, in order.
            for start in range(0, world, degree):
                ranks = tuple(range(start, start + degree))
                g = dist.new_group(list(ranks))
                if me in ranks:
                    mine = RankGroup(g, me - start, degree, ranks)
        _GROUPS[key] = mine
    return _GROUPS[key]


def _forget_groups() -> None:
    _GROUPS.clear()


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8]


def broadcast_tensor(t: torch.Tensor | None, src: int, rg: RankGroup, device: torch.device) -> torch.Tensor | None:
    """``t`` from group rank ``src`` on every rank of ``rg`` (shape and dtype travel in a header).

    ``None`` is sent as an empty header, so optional outputs (an absent modality) need no side channel.
    """
    header = torch.zeros(10, dtype=torch.int64, device=device)
    if rg.rank == src:
        if t is None:
            header[0] = -1
        else:
            header[0] = t.dim()
            header[1] = _DTYPES.index(t.dtype)
            header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    dist.broadcast(header, src=rg.ranks[src], group=rg.group)
    ndim = int(header[0])
    if ndim < 0:
        return None
    if rg.rank == src:
        out = t.contiguous()
    else:
        out = torch.empty([int(x) for x in header[2:2 + ndim]], dtype=_DTYPES[int(header[1])], device=device)
    dist.broadcast(out, src=rg.ranks[src], group=rg.group)
    return out


def all_gather_cat(t: torch.Tensor, dim: int, rg: RankGroup) -> torch.Tensor:
    """Concatenate equal-shaped shards of every rank along ``dim``, in rank order."""
    t = t.contiguous()  # empty_like keeps a permuted tensor's strides; collectives write dense buffers
    parts = [torch.empty_like(t) for _ in range(rg.size)]
    dist.all_gather(parts, t, group=rg.group)
    return torch.cat(parts, dim=dim)


def all_to_all(t: torch.Tensor, rg: RankGroup) -> torch.Tensor:
    """``t`` of shape [P, ...]: slice i goes to rank i; returns [P, ...] with slice j from rank j."""
    t = t.contiguous()  # empty_like keeps a permuted tensor's strides; collectives write dense buffers
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t, group=rg.group)
    return out


def all_reduce_sum(t: torch.Tensor, rg: RankGroup) -> torch.Tensor:
    """Sum of ``t`` over the group (a new tensor; ``t`` is untouched)."""
    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=rg.group)
    return out


# ----------------------------------------------------------------------------- launching
# NVLink multicast (NVLS) off in every process we start: on shared multi-GPU hosts a program that uses
# it can put the host's GPUs out of service (a documented hazard of the H200 hosts vidtune measured on); values already set are kept.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def no_multicast_env() -> None:
    """Set ``NO_MULTICAST``'s variables in this process's environment (spawned ranks inherit it)."""
    for key, value in NO_MULTICAST.items():
        os.environ.setdefault(key, value)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_from_env() -> bool:
    """Join the world described by torchrun-style variables (WORLD_SIZE, RANK, MASTER_*).

    Returns True when a world of more than one process was joined. NCCL with one GPU per local rank
    when CUDA is available, else gloo.
    """
    no_multicast_env()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    dist.init_process_group(backend)
    return True


def join_local_world(rank: int, world: int, port: int, backend: str, timeout_s: float | None = None) -> str:
    """Join a world of ``world`` processes on this machine (rendezvous on 127.0.0.1:``port``).

    NCCL ranks take GPU ``rank``. Returns the device string of this rank (``cuda:<rank>`` or ``cpu``).
    """
    from datetime import timedelta

    if backend == "nccl":
        torch.cuda.set_device(rank)
    kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    # the rendezvous address goes to init_process_group, not into os.environ: torchrun-style variables
    # left in a process that was rank 0 of a worker (a campaign's actor, a test) reached the processes it
    # started later, which then waited for a rank 1 that never came
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kwargs)
    return f"cuda:{rank}" if backend == "nccl" else "cpu"


def leave_world() -> None:
    """Leave the process group and forget the groups cut from it."""
    dist.destroy_process_group()
    _forget_groups()


def _worker(rank: int, world: int, port: int, backend: str, fn: Callable, args: tuple, out_dir: str,
            threads: int, state: tuple) -> None:
    from vidtune._compat import enter_creator_state

    enter_creator_state(state)
    torch.set_num_threads(threads)
    join_local_world(rank, world, port, backend)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        leave_world()


def launch(fn: Callable[..., Any], world: int, *args: Any, backend: str | None = None,
           threads_per_rank: int | None = None) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` new processes joined in one process group (on a host without CUDA
    forked from a server that imported torch and the pipeline once: ``vidtune._compat.child_context``).

    Rendezvous is on 127.0.0.1 only. ``fn`` must be importable (a module-level function). Returns the
    per-rank return values (``torch.save``-able) in rank order; an exception in any rank is raised
    here with that rank's traceback. Backend: NCCL when there are ``world`` GPUs, else gloo. Threads
    per rank: the CPU's cores shared out (CPU results can depend on the intra-op thread count: the tiny
    preset's vocoder output moved by 0.01 between 1 and 2 threads; compare runs at equal threads).
    """
    import torch.multiprocessing as mp

    from vidtune._compat import child_context, creator_state

    if world < 1:
        raise ValueError(f"nproc must be >= 1, got {world}")
    no_multicast_env()
    if threads_per_rank is None:
        threads_per_rank = max(1, usable_cores() // world)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    with tempfile.TemporaryDirectory(prefix="vidtune-launch-") as out_dir:
        method = child_context().get_start_method()  # (forkserver without CUDA, else spawn)
        mp.start_processes(_worker, args=(world, free_port(), backend, fn, args, out_dir, threads_per_rank,
                                          creator_state()), nprocs=world, join=True, start_method=method)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]
