"""Compile cost paid once: Inductor's compiled artifacts persisted across processes and machines.

``torch.compiler.save_cache_artifacts`` returns every artifact this process compiled (Inductor's FX
graphs, AOTAutograd entries, Triton kernels, autotuning results: the "mega-cache"), and
``load_cache_artifacts`` puts such a blob into the local caches, so that the next compile of the same
graph is a cache hit instead of an Inductor compile (Dynamo still traces: seconds per graph). The
compiling techniques (``kernel_choice.compile``, ``kernel_choice.vae_decode``) call ``attach`` when they
are applied: at the start of the first run (every technique is applied by then) it loads the blob
stored under the setting's key, if any, and after each run that compiled something new it stores the
process's artifacts under that key again.

The key: the setting (the transformer blocks' and the decoder's installed callables described by value,
as ``kernel_choice.compile`` fingerprints them, and what the techniques record in ``applied_info``), the
model's size, the device (GPU name and compute capability, or the CPU) and the versions of Python, torch, Triton
and CUDA. A blob is only loaded where all of these match. It holds every shape the setting was compiled
for (stage 1, stage 2, each request size met), as a Dynamo graph is guarded on its shapes anyway. The
folder is off (None) until ``set_cache_dir`` names one: the CLI and the campaign's workers use
``<results_dir>/compile_cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

_DIR: Path | None = None
_LOADED: set[str] = set()  # keys loaded in this process (a blob is loaded once)
_LOADS: list[dict[str, Any]] = []  # every load (or failed load) of this process, reported with each run


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Where blobs are kept (None: not persisted)."""
    global _DIR
    _DIR = Path(path) if path is not None else None


def cache_dir() -> Path | None:
    return _DIR


def forget_loads() -> None:
    """This process as a new one: no blob counted as loaded (a worker configured for another campaign)."""
    _LOADED.clear()
    _LOADS.clear()


def _versions(device: torch.device) -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # no Triton on this machine
        triton_version = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = {"gpu": torch.cuda.get_device_name(index), "capability": list(torch.cuda.get_device_capability(index)),
                 "cuda": torch.version.cuda}
    else:
        where = {"cpu": platform.processor() or platform.machine()}
    return {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton_version, **where}


def setting_of(pipeline: Any) -> dict[str, Any]:
    """What the compiled graphs depend on besides the versions and the shapes (see the module docstring)."""
    from vidtune.techniques.kernel_choice.compile import describe_callable, block_signature

    models = pipeline.models
    decoder = [(name, type(m).__qualname__, describe_callable(m.__dict__["forward"]) if "forward" in m.__dict__ else None)
               for name, m in models.video_decoder.named_modules()]
    return {"blocks": repr(block_signature(pipeline.transformer_blocks())), "decoder": repr(decoder),
            "applied": pipeline.applied_info, "dtype": str(pipeline.dtype),
            # the model by its shape (weights do not enter a graph; a blob for another model would only miss)
            "model": [sum(p.numel() for p in m.parameters()) for m in (models.transformer, models.video_decoder)]}


def cache_key(parts: dict[str, Any], device: torch.device) -> str:
    text = json.dumps({**parts, "versions": _versions(device)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class _Persister:
    """Runs after every pipeline run (a recorder): stores the artifacts when something new compiled."""

    def __init__(self, technique: str, pipeline: Any) -> None:
        self.technique, self.pipeline = technique, pipeline
        self.saved_graphs = -1
        self.saved_misses = 0
        self.key: tuple[str, dict[str, Any]] | None = None
        self.events: list[dict[str, Any]] = []
        self.unreadable = False  # the stored blob failed to load: replace it even where nothing new compiled

    def tensors(self) -> list[torch.Tensor]:
        return []

    def _key(self) -> tuple[str, dict[str, Any]]:
        if self.key is None:  # (the setting does not change while the patch is applied)
            parts = setting_of(self.pipeline)
            self.key = cache_key(parts, self.pipeline.device), parts
        return self.key

    def load(self) -> None:
        """Load the blob of this setting, once per process."""
        if _DIR is None:
            return
        key, _ = self._key()
        path = _DIR / f"{key}.bin"
        if key in _LOADED or not path.is_file():
            return
        t0 = time.time()
        blob = path.read_bytes()
        try:
            # the sidecar's digest first: a torn copy still unpickles in part (seen: half a blob loaded
            # without an error), and a blob is trusted only whole
            want = json.loads((_DIR / f"{key}.json").read_text()).get("sha256")
            if want != hashlib.sha256(blob).hexdigest():
                raise ValueError(f"{path.name} does not match the digest in {key}.json (torn or replaced)")
            info = torch.compiler.load_cache_artifacts(blob)
            if info is None:
                raise ValueError(f"{path.name} holds no cache artifacts")
        except Exception as e:  # compile as if there were none, and say so
            self.unreadable = True
            self._loaded({"key": key, "loaded": False, "error": f"{type(e).__name__}: {e}"})
            return
        _LOADED.add(key)
        self._loaded({"key": key, "loaded": True, "bytes": len(blob), "load_s": round(time.time() - t0, 3),
                      "artifacts": _count(info)})

    def _loaded(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        _LOADS.append(event)

    def record(self, records: dict[str, Any], values: list[float]) -> None:
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]
        # stored again only when Inductor compiled a graph it did not find (a miss), or none is stored:
        # Dynamo counts a graph served from the cache as new too, and re-writing an unchanged 70 MB blob
        # after every cached start (seen on the H200) costs a write and a window in which it is torn. A stored
        # blob that failed to load counts as none: where this machine's own Inductor cache held every graph
        # nothing is a miss, and the torn blob would stay for the next machine
        misses = counters["inductor"].get("fxgraph_cache_miss", 0)
        stored = _DIR is not None and (_DIR / f"{self._key()[0]}.bin").is_file() and not self.unreadable
        if _DIR is not None and graphs != self.saved_graphs and (misses != self.saved_misses or not stored):
            self.saved_graphs, self.saved_misses = graphs, misses
            got = torch.compiler.save_cache_artifacts()
            if got is not None:
                blob, info = got
                key, parts = self._key()
                _DIR.mkdir(parents=True, exist_ok=True)
                meta = {**parts, "versions": _versions(self.pipeline.device), "sha256": hashlib.sha256(blob).hexdigest()}
                # each file replaced atomically; a reader between the two sees a digest that does not match
                # and compiles afresh
                for name, data in ((f"{key}.bin", blob), (f"{key}.json", json.dumps(meta, indent=1, default=str).encode())):
                    tmp = _DIR / f".{name}.{os.getpid()}.tmp"
                    tmp.write_bytes(data)
                    os.replace(tmp, _DIR / name)
                _LOADED.add(key)  # (what this process compiled is in its caches already)
                self.unreadable = False
                self.events.append({"key": key, "saved": True, "bytes": len(blob), "artifacts": _count(info)})
        if _DIR is not None:
            # Inductor's own count of graphs it found in its caches (hit) or compiled (miss), this process
            inductor = {k: v for k, v in counters["inductor"].items() if k.endswith(("cache_hit", "cache_miss"))}
            # loads: every load of this process (a run's own events hold only what that run did)
            records["compile_cache"] = {"dir": str(_DIR), "events": list(self.events), "loads": list(_LOADS),
                                        "inductor": inductor}

    def reset(self) -> None:
        """At every run's start (``reset_stats``): the first one loads the stored blob."""
        self.events.clear()
        self.load()


def _count(info: Any) -> int | None:
    artifacts = getattr(info, "artifacts", None)
    return sum(len(v) for v in artifacts.values()) if isinstance(artifacts, dict) else None


def attach(pipeline: Any, technique: str, patch: Any) -> None:
    """Persist this pipeline's compiled artifacts while ``patch`` is applied (one persister per pipeline)."""
    if any(isinstance(r, _Persister) for r in pipeline.recorders):
        return
    persister = _Persister(technique, pipeline)
    pipeline.recorders.append(persister)
    patch.on_undo(lambda: pipeline.recorders.remove(persister))
