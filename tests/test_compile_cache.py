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
    """One ``vidtune evaluate`` in a new process with its own (empty) Inductor cache: a fresh machine."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir)}
    cmd = [sys.executable, "-m", "vidtune.cli", "evaluate", "model=tiny", f"results_dir={results}", "name=cc",
           "eval.repeats=1", "eval.warmup=0", *extra, "--json", "--knobs", "kernel_choice.vae_decode.compile=default"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_new_process_loads_what_an_earlier_one_compiled(tmp_path):
    first = _evaluate(tmp_path / "results", tmp_path / "inductor1")
    rec = first["stats"]["compile_cache"]
    saved = [e for e in rec["events"] if e.get("saved")]
    assert saved and saved[-1]["bytes"] > 0 and rec["inductor"].get("fxgraph_cache_miss", 0) > 0
    assert "fxgraph_cache_hit" not in rec["inductor"]
    key = saved[-1]["key"]
    blob = tmp_path / "results" / "compile_cache" / f"{key}.bin"
    assert sorted(blob.parent.glob("*.bin")) == [blob]
    # a second machine (another empty Inductor cache), the same results folder: the blob is loaded and the
    # graphs are found, not compiled (measured: 8 of the 9 hit in the second process, all 9 in a third)
    second = _evaluate(tmp_path / "results", tmp_path / "inductor2")
    rec2 = second["stats"]["compile_cache"]
    assert [e["key"] for e in rec2["events"] if e.get("loaded")] == [key]
    assert rec2["inductor"].get("fxgraph_cache_hit", 0) >= rec2["inductor"].get("fxgraph_cache_miss", 0) + 6
    assert second["quality"]["psnr_db"] == pytest.approx(first["quality"]["psnr_db"], abs=1e-6)
    # a torn blob (a machine killed while copying it): reported, compiled afresh, stored again whole
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    third = _evaluate(tmp_path / "results", tmp_path / "inductor3")
    rec3 = third["stats"]["compile_cache"]
    assert any(e.get("loaded") is False and e.get("error") for e in rec3["events"])
    assert rec3["inductor"].get("fxgraph_cache_miss", 0) >= 8 and any(e.get("saved") for e in rec3["events"])
    assert blob.stat().st_size > 1000 and torch.compiler.load_cache_artifacts(blob.read_bytes()) is not None


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
