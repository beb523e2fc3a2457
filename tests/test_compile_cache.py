"""Compiled artifacts kept across processes (techniques/kernel_choice/compile_cache.py), on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vidtune.techniques.kernel_choice.compile_cache import cache_key


def _evaluate(results: Path, inductor_dir: Path, request, *extra: str) -> dict:
    """One ``vidtune evaluate`` of ``request`` in a new process with its own (empty) Inductor cache: a fresh
    machine. The setting compiles the transformer's blocks, static: two graphs (stage 1's and stage 2's shapes);
    the VAE decoder's ten, traced with symbolic shapes, would cost far more in each process and check nothing
    more."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir)}
    cmd = [sys.executable, "-m", "vidtune.cli", "evaluate", "model=tiny", f"request.height={request.height}",
           f"request.width={request.width}", f"request.frames={request.frames}", f"request.seed={request.seed}",
           f"request.prompt={request.prompt}", f"results_dir={results}", "name=cc", "eval.repeats=1",
           "eval.warmup=0", *extra, "--json", "--knobs", "kernel_choice.compile.mode=default",
           "kernel_choice.compile.dynamic=false"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_blob_is_written_loaded_by_a_new_process_and_written_whole_again_when_torn(
        tmp_path, tiny_models, tiny_request, tiny_reference_output, monkeypatch):
    """The compiled setting's artifacts kept across processes, in three steps:
    1. this process compiles the setting (with the suite's Inductor cache, where another test may have compiled
       the same graphs: they are then found, not compiled) and stores the blob under ``results/compile_cache``;
    2. a new process with an empty Inductor cache (a second machine) and the same results folder loads the blob
       and finds every graph in it: nothing compiled, so nothing written again; its video is this process's;
    3. the blob torn in half (a machine killed while copying it): reported on the next load, and written whole
       again (it would stay torn where nothing is a miss).
    (One process compiles instead of two: a second cold compile in a new process cost ~60 s on 2 cores.)"""
    from torch._dynamo.utils import counters

    from vidtune.model import ReferencePipeline
    from vidtune.search.metrics import quality
    from vidtune.techniques import get
    from vidtune.techniques.kernel_choice import compile_cache

    folder = tmp_path / "results" / "compile_cache"
    monkeypatch.setattr(compile_cache, "_LOADED", set())
    compile_cache.set_cache_dir(folder)
    pipe = ReferencePipeline(tiny_models)
    technique = get("kernel_choice.compile")
    values = {"mode": "default", "dynamic": False}
    try:
        torch._dynamo.reset()
        counters.clear()
        with technique.apply(pipe, values):
            out = pipe.run(tiny_request)
        found = {k: v for k, v in counters["inductor"].items() if k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
        assert sum(found.values()) == 2, found  # stage 1's graph and stage 2's, compiled or found
        saved = [e for e in out.stats["compile_cache"]["events"] if e.get("saved")]
        blobs = sorted(folder.glob("*.bin"))
        assert saved and [b.stem for b in blobs] == [saved[-1]["key"]] and blobs[0].stat().st_size > 0
        blob = blobs[0]
        psnr = quality(tiny_reference_output.frames, tiny_reference_output.audio, out.frames, out.audio).psnr_db

        # 2. a second machine: the blob is loaded and every graph found in it
        before = blob.stat().st_mtime_ns
        second = _evaluate(tmp_path / "results", tmp_path / "inductor2", tiny_request)
        rec2 = second["stats"]["compile_cache"]
        assert [e["key"] for e in rec2["loads"] if e.get("loaded")] == [blob.stem]
        assert rec2["inductor"] == {"fxgraph_cache_hit": 2}
        assert not [e for e in rec2["events"] if e.get("saved")] and blob.stat().st_mtime_ns == before
        # the loaded graphs compute the same video: within 0.05 dB, not 1e-6 (their float rounding may depend on
        # the CPU: cached decoder graphs scored 52.562 dB against a fresh compile's 52.555 dB on an AMD EPYC,
        # 2026-12-02); a wrong graph moves it by far more
        assert second["quality"]["psnr_db"] == pytest.approx(psnr, abs=0.05)

        # 3. torn: (in this process, as a new process on this machine: every graph a hit, no miss counted)
        blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
        compile_cache._LOADED.clear()
        counters.clear()
        torch._dynamo.reset()
        with technique.apply(pipe, values):
            events = pipe.run(tiny_request).stats["compile_cache"]["events"]
    finally:
        compile_cache.set_cache_dir(None)
        torch._dynamo.reset()
    assert [e["error"] for e in events if e.get("loaded") is False][0].startswith("ValueError: ")
    assert "does not match the digest" in events[0]["error"] and any(e.get("saved") for e in events)
    assert not counters["inductor"].get("fxgraph_cache_miss")  # (found in this machine's cache, not compiled)
    assert blob.stat().st_size > 1000 and torch.compiler.load_cache_artifacts(blob.read_bytes()) is not None  # whole again


def test_compile_cache_setting():
    from vidtune.cli import CliError, Settings, load_config

    assert Settings(load_config(["model=tiny", "results_dir=/r"])).compile_cache == "/r/compile_cache"
    assert Settings(load_config(["model=tiny", "compile_cache=false"])).compile_cache == ""
    with pytest.raises(CliError, match="compile_cache must be true or false"):
        Settings(load_config(["model=tiny", "compile_cache=maybe"]))


def test_the_key_follows_setting_and_versions():
    import torch

    cpu = torch.device("cpu")
    a = cache_key({"blocks": "x", "applied": {"kernel_choice.compile": {"mode": "default"}}}, cpu)
    assert a == cache_key({"applied": {"kernel_choice.compile": {"mode": "default"}}, "blocks": "x"}, cpu)
    assert a != cache_key({"blocks": "x", "applied": {"kernel_choice.compile": {"mode": "max-autotune"}}}, cpu)
