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


def _evaluate(results: Path, inductor_dir: Path, *extra: str) -> dict:
    """One ``vidtune evaluate`` in a new process with its own (empty) Inductor cache: a fresh machine. The setting
    compiles the transformer's blocks, static: two graphs (stage 1's and stage 2's shapes); the VAE decoder's
    ten, traced with symbolic shapes, would cost far more in each process and check nothing more."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir)}
    cmd = [sys.executable, "-m", "vidtune.cli", "evaluate", "model=tiny", "request.height=128", "request.width=192",
           "request.frames=9", f"results_dir={results}", "name=cc", "eval.repeats=1", "eval.warmup=0", *extra,
           "--json", "--knobs", "kernel_choice.compile.mode=default", "kernel_choice.compile.dynamic=false"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_new_process_loads_what_an_earlier_one_compiled(tmp_path):
    first = _evaluate(tmp_path / "results", tmp_path / "inductor1")
    rec = first["stats"]["compile_cache"]
    # (saved after the run that compiled: the record's events are its last run's, which compiled nothing more)
    assert rec["inductor"].get("fxgraph_cache_miss", 0) == 2 and "fxgraph_cache_hit" not in rec["inductor"]
    blobs = sorted((tmp_path / "results" / "compile_cache").glob("*.bin"))
    assert len(blobs) == 1 and blobs[0].stat().st_size > 0
    blob = blobs[0]
    key = blob.stem
    # a second machine (another empty Inductor cache), the same results folder: the blob is loaded and every
    # graph is found, not compiled; so the blob is not written again (it was after every cached start)
    before = blob.stat().st_mtime_ns
    second = _evaluate(tmp_path / "results", tmp_path / "inductor2")
    rec2 = second["stats"]["compile_cache"]
    assert [e["key"] for e in rec2["loads"] if e.get("loaded")] == [key]
    assert rec2["inductor"] == {"fxgraph_cache_hit": 2}
    assert not [e for e in rec2["events"] if e.get("saved")] and blob.stat().st_mtime_ns == before
    # the loaded graphs compute the same video: within 0.05 dB, not 1e-6 (their float rounding may depend on the
    # CPU: cached decoder graphs scored 52.562 dB against a fresh compile's 52.555 dB on an AMD EPYC, 2026-12-02);
    # a wrong graph moves it by far more
    assert second["quality"]["psnr_db"] == pytest.approx(first["quality"]["psnr_db"], abs=0.05)


def test_a_torn_blob_is_reported_and_written_whole_again(tmp_path, tiny_models, tiny_request, monkeypatch):
    """(In this process: a blob torn in half, as a machine killed while copying it leaves it.) With this
    process's Inductor cache, the suite's shared one: its graphs may all be found there, and the torn blob is
    written whole again all the same (it stayed torn before, where nothing was a miss)."""
    from torch._dynamo.utils import counters

    from vidtune.model import ReferencePipeline
    from vidtune.techniques import get
    from vidtune.techniques.kernel_choice import compile_cache

    monkeypatch.setattr(compile_cache, "_LOADED", set())
    compile_cache.set_cache_dir(tmp_path / "cc")
    pipe = ReferencePipeline(tiny_models)
    technique = get("kernel_choice.compile")
    try:
        torch._dynamo.reset()
        with technique.apply(pipe, {"mode": "default", "dynamic": False}):
            saved = [e for e in pipe.run(tiny_request).stats["compile_cache"]["events"] if e.get("saved")]
        blob = tmp_path / "cc" / f"{saved[-1]['key']}.bin"
        blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
        compile_cache._LOADED.clear()  # (as a new process on this machine: every graph a hit, no miss counted)
        counters.clear()
        torch._dynamo.reset()
        with technique.apply(pipe, {"mode": "default", "dynamic": False}):
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
