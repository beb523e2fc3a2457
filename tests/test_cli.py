"""The vidtune command line: as a real subprocess, and its ``main`` in this process for the many bad-input cases."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    exe = shutil.which("vidtune")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "vidtune.cli", *args]
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_knobs_json_lists_every_technique(tmp_path):
    res = _run(["knobs", "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["families"] == ["caching", "sparse_attention", "tiling", "kernel_choice", "parallelism", "memory"]
    sdpa = next(t for t in data["techniques"] if t["name"] == "kernel_choice.sdpa_backend")
    assert sdpa["knobs"]["video_self"]["off"] == "off" and "cudnn" in sdpa["knobs"]["video_self"]["choices"]
    assert sdpa["stages"] == ["stage1", "stage2"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["evaluate", "request.height=100"], "request.height must be a positive multiple of 64"),
        (["evaluate", "request.frames=20"], "request.frames must be 8k+1"),
        (["evaluate", "request.fps=0"], "request.fps must be a positive number"),
        (["evaluate", "request.mode=fast"], "request.mode must be one of ['distilled', 'multistep']"),
        (["evaluate", "--knobs", "kernel_choice.sdpa_backend.video_self=fastest"],
         "kernel_choice.sdpa_backend.video_self must be one of ['off', 'cudnn', 'efficient', 'flash', 'math']"),
        (["evaluate", "--knobs", "kernel_choice.sdpa_backend.nope=flash"], "has no knob 'nope'"),
        (["evaluate", "--knobs", "caching.nope.x=1"], "unknown technique 'caching.nope'"),
        (["generate", "model=nope"], "Could not find 'model/nope'"),
        (["generate", "request.colour=red"], "request.colour is not a config field"),
        (["baseline", "model=checkpoint"], "model.checkpoint is required"),
        (["baseline", "eval.repeats=0"], "eval.repeats must be an integer >= 1"),
        (["evaluate", "eval.memory_budget_gb=-2"], "eval.memory_budget_gb must be null (the whole GPU) or a number of GiB > 0"),
        (["campaign", "gate.peak_memory_gb=lots"], "gate.peak_memory_gb must be a number or null, got 'lots'"),
    ],
)
def test_bad_input_fails_fast_naming_the_field(tmp_path, monkeypatch, capsys, args, needle):
    """In this process (``main`` is what the console script calls; a Python start per case cost ~7 s on a 2-core
    CPU); the console script itself exits 2 in ``test_the_console_script_refuses_bad_input``."""
    from vidtune.cli import main

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("VIDTUNE_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    assert needle in capsys.readouterr().err
    assert not any(cache.iterdir()), "no model may be built for a bad input"
    assert not (tmp_path / "results").exists()


def test_the_console_script_refuses_bad_input(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    res = _run(["evaluate", "request.height=100"], tmp_path, {"VIDTUNE_CACHE": str(cache)}, timeout=120)
    assert res.returncode == 2 and "request.height must be a positive multiple of 64" in res.stderr
    assert res.stderr.startswith("vidtune: error: ") and "Traceback" not in res.stderr
    assert not any(cache.iterdir()) and not (tmp_path / "results").exists()


@pytest.mark.slow
def test_evaluate_end_to_end(tmp_path):
    env = {"VIDTUNE_CACHE": str(tmp_path / "cache")}
    common = ["name=cli", f"results_dir={tmp_path / 'results'}", "eval.repeats=1", "eval.warmup=0"]
    res = _run(["evaluate", *common, "--knobs", "kernel_choice.sdpa_backend.video_self=math", "--json"], tmp_path, env)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["knobs"]["kernel_choice.sdpa_backend"]["video_self"] == "math"
    assert set(data["latency_ms"]) == {"stage1", "upsample", "stage2", "decode_video", "decode_audio"}
    assert data["quality"]["psnr_db"] > 30 and data["baseline_reused"] is False
    assert data["provenance"]["command"].startswith("vidtune evaluate name=cli") and data["provenance"]["request"]
    assert (tmp_path / "results" / "cli" / "baseline" / "video.mp4").is_file()
    gen = _run(["generate", *common, f"out={tmp_path / 'gen'}"], tmp_path, env)
    assert gen.returncode == 0, gen.stderr
    assert (tmp_path / "gen" / "video.mp4").is_file() and json.loads(gen.stdout)["frames"] == [17, 256, 384, 3]


def test_generic_module_names_not_importable(tmp_path):
    """vidtune.model etc. import; no top-level `model`/`kernels`/`search` module is installed."""
    code = (
        "import importlib.util as u, vidtune.model, vidtune.kernels, vidtune.search, vidtune.techniques, "
        "vidtune.integrator; "
        "print(sorted(m for m in ('kernels','model','search','techniques','integrator','conf') if u.find_spec(m)))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_every_command_parses_its_options():
    """Each subcommand accepts the options its help promises (a misplaced add_argument fails here)."""
    from vidtune.cli import _parser

    p = _parser()
    assert p.parse_args(["evaluate", "--knobs", "a.b.c=1", "--json"]).json is True
    assert p.parse_args(["baseline", "--force"]).force is True
    assert p.parse_args(["bench", "--config", "t.yaml", "--repeats", "3"]).repeats == 3
    assert p.parse_args(["generate", "--config", "t.yaml"]).config == "t.yaml"
    assert p.parse_args(["signoff", "c", "--by", "A", "--verdict", "reject"]).verdict == "reject"
    assert p.parse_args(["ask", "c", "--family", "caching"]).family == "caching"
    assert p.parse_args(["tell", "c", "--trial", "2", "--result", "r.json"]).trial == 2
    assert p.parse_args(["report", "c", "--results-dir", "x"]).results_dir == "x"
    assert p.parse_args(["knobs", "--json"]).json is True


def test_technique_warnings_reach_the_output_and_stderr(capsys):
    """bench/evaluate list the warnings techniques record (tile_parallel with fewer tiles than ranks) in
    their JSON and on stderr; records without one add nothing."""
    from vidtune.commands.run import warn as _warn
    from vidtune.techniques.parallelism.tile_parallel import tile_shortage

    stats = {"stage1.passes": 8, "stage2_tiles": {"rows": 1, "cols": 1},
             "parallelism.tile_parallel": {"degree": 4, "tiles": 2, "warning": tile_shortage("p.t", 4, 2)}}
    assert _warn(stats) == ["p.t.degree=4 with 2 stage-2 tiles: 2 of 4 ranks idle; "
                            "use tiling.stage2_tiles (or eval.stage2_tiles) rows x cols >= 4"]
    assert "warning: p.t.degree=4 with 2 stage-2 tiles" in capsys.readouterr().err
    assert _warn({"stage1.passes": 8}) == []


def test_bench_also_measures_more_settings_against_the_same_baseline_runs(tmp_path, capsys):
    """bench --also NAME:KNOBS: each more setting is warmed up and alternated with the one baseline (A B s ...,
    ... s B A); its ratio is against the same baseline runs, per stage too; a bad --also is named before any
    model is built."""
    import statistics

    from vidtune.cli import main

    args = ["bench", "model=tiny", "request.height=128", "request.width=192", "request.frames=9",
            f"results_dir={tmp_path}", "eval.warmup=0", "--reference", "run", "--no-rewarm", "--repeats", "2",
            "--knobs", "kernel_choice.sdpa_backend.video_self=math"]
    assert main([*args, "--also", "skip:caching.step_skip.every=2,caching.step_skip.first_kept=1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["order"].startswith("A B skip, skip B A")
    skip = out["others"]["skip"]
    assert len(skip["tuned_total_ms"]) == len(out["baseline_total_ms"]) == len(out["tuned_total_ms"]) == 2
    assert skip["knobs"]["caching.step_skip"]["every"] == 2
    assert skip["speedup"] == pytest.approx(statistics.median(out["baseline_total_ms"]) /
                                            statistics.median(skip["tuned_total_ms"]), abs=1e-4)
    assert skip["stages"]["stage2"]["baseline_ms"] == out["stages"]["stage2"]["baseline_ms"]  # the same A runs
    assert skip["stats"]["caching.step_skip"]["stage1"]["cached"] > 0 and "caching.step_skip" not in out["stats"]
    assert skip["quality"]["psnr_db"] < 99
    made = out["provenance"]  # (what made it: the result can be quoted on its own)
    assert made["command"].startswith("vidtune bench model=tiny request.height=128") and "--also skip:" in made["command"]
    assert made["request"]["height"] == 128 and made["model"]["preset"] == "tiny" and made["device"].startswith("cpu")
    assert made["versions"]["torch"] and made["versions"]["ltx_core"] == "1.0.0" and made["versions"]["optuna"]
    for bad, needle in (("noname", "--also must be NAME:KNOB=VALUE"), ("B:caching.step_skip.every=2", "not A or B"),
                        ("x:caching.step_skip.every=9", "caching.step_skip")):
        assert main([*args, "--also", bad]) == 2
        assert needle in capsys.readouterr().err


def test_the_config_defaults_are_written_once(tmp_path):
    """The config's schema (conf/schema.py) takes its defaults from the dataclasses of the lower layers (the
    worker's spec, the campaign's spec, the gate, the request, the model source): the composed config, the worker
    spec and the campaign spec a default campaign makes agree with those dataclasses' own defaults; no YAML under
    conf/ sets a field outside the defaults list and the model group's choice; eval.flip_frames=0 stays 0."""
    import dataclasses
    import inspect

    from vidtune.model.request import GenerationRequest
    from vidtune.search.defaults import FLIP_FRAMES, RATIO_TOLERANCE
    from vidtune.search.evaluator import evaluate_paired
    from vidtune.search.spec import CampaignSpec, Gate
    from vidtune.search.worker import WorkerSpec
    from vidtune.settings import Settings, load_config

    spec = WorkerSpec(source={}, request={}, device="cpu")
    assert (spec.flip_frames, spec.ratio_tolerance) == (FLIP_FRAMES, RATIO_TOLERANCE)
    assert inspect.signature(evaluate_paired).parameters["tolerance"].default == RATIO_TOLERANCE
    settings = Settings(load_config([f"results_dir={tmp_path}", "model=tiny", "tiers=none"]))
    made = settings.worker_spec()
    for key in ("repeats", "warmup", "paired", "ratio_tolerance", "baseline_mp4", "flip_frames", "memory_budget_gb",
                "estimate", "vae_tiling"):
        assert made[key] == getattr(spec, key), key
    assert made["request"] == GenerationRequest().to_dict()
    campaign = settings.campaign_spec()
    plain = CampaignSpec(name="x", results_dir="r", families=("caching",), trials_per_family=1, gate=Gate())
    for key in ("trial_timeout_s", "num_actors", "ranks_per_actor", "seed", "integrator_max_exhaustive",
                "integrator_trials", "integrator_merge", "final_repeats", "integrator_max_p", "catalogue", "knowledge",
                "probes", "screen", "prune", "verdict_candidates", "storage", "ray_address"):
        assert getattr(campaign, key) == getattr(plain, key), key
    assert campaign.gate == Gate()
    written = {f.name for f in dataclasses.fields(Gate)}
    for path in (ROOT / "conf").rglob("*.yaml"):
        if path.parent.name == "tiers":  # a tier's gate: only gate fields
            from omegaconf import OmegaConf

            assert all(set(g) <= written for g in OmegaConf.load(path).values()), path
        elif path.parent.name == "model":
            assert set(__import__("yaml").safe_load(path.read_text())) == {"preset"}, path
        else:
            assert set(__import__("yaml").safe_load(path.read_text())) == {"defaults"}, path
    assert Settings(load_config([f"results_dir={tmp_path}", "model=tiny", "eval.flip_frames=0"])).flip_frames == 0


def test_a_wrong_field_or_type_is_refused_naming_the_field_and_what_it_takes(tmp_path):
    """The schema refuses at composition a value of the wrong type and a field that does not exist, naming the
    field (and, for a value, what it takes); a tier's fields are checked by the settings, as precisely."""
    from vidtune.settings import CliError, Settings, load_config

    for override, needle in (("eval.repeats=many", "eval.repeats must be an integer, got 'many'"),
                             ("compile_cache=maybe", "compile_cache must be true or false, got 'maybe'"),
                             ("gate.flip=abc", "gate.flip must be a number or null, got 'abc'"),
                             ("+tiers.loose.flip=abc", "tiers.loose.flip must be a number or null"),
                             ("request.stage1_sigmas=[a]", "must be a list of numbers or null"),
                             ("eval.repeat=3", "eval.repeat"), ("+budget.hours=1", "budget.hours")):
        with pytest.raises(CliError, match=re.escape(needle)):
            Settings(load_config([f"results_dir={tmp_path}", override])).campaign_spec()


def test_a_campaign_exports_per_tier_by_default_and_tiers_none_turns_it_off(tmp_path):
    """The default campaign has the calibrated tiers (lossless, high, balanced, each gating the audio's
    STFT-magnitude SNR); tiers=none and tiers=null give the single gate; a tier added to none is the only one."""
    from vidtune.settings import Settings, load_config

    def tiers(*overrides: str) -> dict:
        spec = Settings(load_config([f"results_dir={tmp_path}", *overrides])).campaign_spec()
        return dict(spec.tiers or ())

    default = tiers()
    assert list(default) == ["lossless", "high", "balanced"]
    assert [g.audio_spectral_snr_db for g in default.values()] == [30.0, 20.0, 15.0]
    assert all(g.audio_spectral_db is None for g in default.values())
    assert tiers("tiers=none") == {} and tiers("tiers=null") == {}
    assert list(tiers("tiers=none", "+tiers.mine.flip_worst=0.1")) == ["mine"]
