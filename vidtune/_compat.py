"""Import-time compatibility for CPU-only machines.

ltx-core 1.0.0 imports torchaudio at module level (only its audio *encoder* uses it). PyPI's
torchaudio wheel is a CUDA build whose native extension fails to load beside the CPU torch wheel
(``libc10_cuda.so``; docs/environment.md). vidtune never runs the audio encoder, so when the native
extension cannot load we register an empty ``torchaudio._extension`` module before the import. This
runs on ``import vidtune``, so every process that imports vidtune (Ray workers included) gets it; with a
working torchaudio (the CUDA torch on the GPU machine) nothing is changed.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

__all__ = ["child_context", "creator_state", "enter_creator_state", "lazy_names", "ensure_torchaudio_importable", "TORCHAUDIO_STUBBED", "fast_cpu_convolutions", "CPU_CONV_UPCAST", "usable_cores",
           "actor_threads"]

TORCHAUDIO_STUBBED = False


def _passthrough(*args, **kwargs):
    """Stand-in for the extension's decorators (``fail_if_no_align`` ...): return the function as is."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return None


def _extension_stub() -> types.ModuleType:
    stub = types.ModuleType("torchaudio._extension")
    stub._IS_TORCHAUDIO_EXT_AVAILABLE = False  # type: ignore[attr-defined]
    stub._IS_ALIGN_AVAILABLE = False  # type: ignore[attr-defined]
    def getattr_(name: str):
        if name.startswith("__"):  # module protocol lookups (__file__, __path__ ...) must fail normally
            raise AttributeError(name)
        return _passthrough

    stub.__getattr__ = getattr_  # type: ignore[attr-defined]
    return stub


def ensure_torchaudio_importable() -> bool:
    """Make ``import torchaudio`` succeed; return True when the native extension was stubbed."""
    global TORCHAUDIO_STUBBED
    if "torchaudio" in sys.modules:
        return TORCHAUDIO_STUBBED
    try:
        importlib.import_module("torchaudio")
        return False
    except ModuleNotFoundError:
        # No torchaudio at all (the GPU image): ltx-core's audio ops only need the name at import.
        stub = types.ModuleType("torchaudio")
        stub.__dict__["__vidtune_stub__"] = True
        sys.modules["torchaudio"] = stub
        TORCHAUDIO_STUBBED = True
        return True
    except OSError:
        for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
            del sys.modules[name]
        sys.modules["torchaudio._extension"] = _extension_stub()
        importlib.import_module("torchaudio")
        TORCHAUDIO_STUBBED = True
        return True


# ---------------------------------------------------------------- CPU convolutions in bf16
# PyTorch runs a bf16 (or fp16) convolution on a CPU through oneDNN only where the CPU has AVX512
# (``torch.ops.mkldnn._is_mkldnn_bf16_supported``); elsewhere it takes ``slow_conv3d`` /
# ``_slow_conv2d``. On an AVX2-only AMD EPYC (torch 2.13.0, 2 threads, 2026-12-02) a tiny-preset
# generation (256x384x17) spent 12.1 of its 12.4 s in those two kernels, and one bf16 Conv3d of the VAE
# took 11.1 s against 0.08-0.13 s in float32. There the convolution runs in float32 and its output is
# rounded once to the input's dtype, which is what oneDNN's bf16 kernels do too (float32 accumulation,
# one rounding): the same values up to summation order, which already differs by CPU model.
#
# ltx-core calls ``F.conv3d`` / ``F.conv2d`` / ``F.conv1d`` / ``F.conv_transpose1d`` directly as well as
# through ``nn.Conv*`` modules (which call the same functions), so the functions are replaced on
# ``torch.nn.functional`` itself: every caller in the process, ltx-pipelines' own pipelines included, takes
# the same path, and the bit-for-bit comparisons with them stay exact. CUDA tensors, float32 and CPUs with
# the fast kernels are untouched; VIDTUNE_CPU_CONV=native keeps PyTorch's own kernels everywhere.
CPU_CONV_FUNCTIONS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
CPU_CONV_UPCAST: frozenset = frozenset()  # the dtypes upcast in this process (empty: nothing replaced)


def _slow_cpu_conv_dtypes() -> frozenset:
    """The half-precision dtypes whose CPU convolutions PyTorch would run on its slow reference path."""
    import os

    import torch

    mode = os.environ.get("VIDTUNE_CPU_CONV", "auto")
    if mode not in ("auto", "native", "float32"):
        raise ValueError(f"VIDTUNE_CPU_CONV must be one of auto, native, float32, got {mode!r}")
    if mode == "native":
        return frozenset()
    if mode == "float32":
        return frozenset({torch.bfloat16, torch.float16})
    slow = set()
    try:
        if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            slow.add(torch.bfloat16)
        if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_fp16_supported()):
            slow.add(torch.float16)
    except (AttributeError, RuntimeError):  # a build without the probes: leave PyTorch's kernels alone
        return frozenset()
    return frozenset(slow)


def _upcasting(fn, upcast: frozenset):
    """``fn`` (a ``torch.nn.functional`` convolution) computing in float32 for CPU inputs in ``upcast``."""
    import functools

    import torch

    @functools.wraps(fn)
    def conv(input, weight, bias=None, *args, **kwargs):
        if input.device.type != "cpu":
            return fn(input, weight, bias, *args, **kwargs)
        # under CPU autocast to a slow dtype (the mini's trainers), autocast would cast the inputs down below
        # this function and take the slow kernel: compute in float32 with autocast off, give autocast's dtype
        cast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        if cast not in upcast:
            if input.dtype not in upcast:
                return fn(input, weight, bias, *args, **kwargs)
            cast = input.dtype
        with torch.autocast("cpu", enabled=False):
            out = fn(input.float(), weight.float(), None if bias is None else bias.float(), *args, **kwargs)
        return out.to(cast)

    conv.__vidtune_upcast__ = fn  # type: ignore[attr-defined]
    return conv


def fast_cpu_convolutions() -> frozenset:
    """Replace the ``torch.nn.functional`` convolutions so that half-precision CPU inputs compute in
    float32 where PyTorch has no fast half-precision kernel (see above); idempotent. Returns the dtypes
    upcast (empty where nothing was replaced)."""
    global CPU_CONV_UPCAST
    import torch.nn.functional as F

    upcast = _slow_cpu_conv_dtypes()
    if not upcast:
        return frozenset()
    for name in CPU_CONV_FUNCTIONS:
        fn = getattr(F, name)
        fn = getattr(fn, "__vidtune_upcast__", fn)
        setattr(F, name, _upcasting(fn, upcast))
    CPU_CONV_UPCAST = upcast
    return upcast


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask (``taskset``, a cgroup cpuset, a batch job's
    share, a test worker's core), not the machine's count. Threads sized by ``os.cpu_count()`` in two processes
    pinned to one core each oversubscribed it: on a 2-core machine two concurrent CPU campaigns ran each
    generation ~10x slower than one alone (OpenMP threads spinning on a core another process holds)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # (no affinity call on this platform)
        return max(1, os.cpu_count() or 1)


# What a child process of vidtune (a gloo rank, a parallel worker's helper rank, the quality model's process on a CPU)
# imports before it runs anything: torch, ltx-core and ltx-pipelines' helpers (transformers with them), ~5 s of CPU
# per process on a 2-core machine when each child imports them itself, as ``spawn`` makes it.
CHILD_PRELOAD = ("vidtune", "torch", "vidtune.model.pipeline", "ltx_pipelines.utils.helpers", "vidtune.techniques",
                 "vidtune.search.worker")


def child_context():
    """The multiprocessing context of vidtune's child processes: on a host without CUDA, ``forkserver``, its server
    importing ``CHILD_PRELOAD`` once and forking each child from it; ``spawn`` on a CUDA host (and where there is no
    forkserver). Why not on a CUDA host: importing ltx-pipelines calls ``torch.cuda.is_available()`` at module level
    (``get_device()`` in seven of its modules), which initialises the CUDA driver (``cuInit``) in the server, and a
    child forked from a process that did cannot use CUDA (PyTorch's "poison fork"). A child of the forkserver starts
    with the environment and working directory the server was started with, not its creator's now: pass
    ``creator_state()`` to the child and call ``enter_creator_state`` first there (harmless under ``spawn``)."""
    import multiprocessing as mp

    import torch

    if "forkserver" not in mp.get_all_start_methods() or torch.cuda.is_available():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(CHILD_PRELOAD))  # (read when the server starts: the first child of this process)
    return ctx


def creator_state() -> tuple[dict[str, str], str]:
    """This process's environment and working directory, for a child of ``child_context``."""
    return dict(os.environ), os.getcwd()


def enter_creator_state(state: tuple[dict[str, str], str]) -> None:
    """In a child of ``child_context``: its creator's environment and working directory (``creator_state``)."""
    env, cwd = state
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)


def actor_threads(actors_here: int | None = None) -> int:
    """The CPU threads a trial actor's torch should use: its host's cores shared by the actors there,
    ``actors_here`` where the caller knows (a local Ray: the pool's actors), else, inside a Ray actor on a
    cluster, one actor per GPU of its node (all the cores on a node without GPUs); at least 1."""
    cores = usable_cores()
    if actors_here is None:
        actors_here = _node_gpus()
    return max(1, cores // max(1, actors_here))


def _node_gpus() -> int:
    """The GPUs of the Ray node this process runs on (one trial actor each); 0 outside a Ray worker, or where
    Ray's state cannot be read (the host is then this actor's alone)."""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()
        return int(next((n.get("Resources", {}).get("GPU", 0) for n in ray.nodes() if n.get("NodeID") == node), 0))
    except Exception:
        return 0


def lazy_names(package: str, where: dict[str, str]):
    """A package's ``__getattr__`` (PEP 562) that imports ``name`` from the submodule ``where[name]`` on first use
    and keeps it in the package (and lists the names in ``dir``): ``vidtune.model`` and ``vidtune.search`` re-export the pipeline and the
    evaluator this way, so that a process that needs neither (the CLI, the campaign's driver) does not import
    ltx-pipelines and transformers (4 of the CLI's 7 s of imports on a 2-core CPU)."""
    module = sys.modules[package]

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(module, name, value)
        return value

    module.__dir__ = lambda: sorted({*vars(module), *where})  # (PEP 562: help() and completion list them too)
    return __getattr__
