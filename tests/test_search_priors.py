"""Where a search starts: the shipped catalogue of starting points (queued first, exact before approximate),
known losers never measured, and the local knowledge base of earlier campaigns on any request."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest

from vidtune.cli import Settings, load_config
from vidtune.driver import Campaign
from vidtune.model import GenerationRequest
from vidtune.search.campaign import ask_effective, save_spec, seed_params
from vidtune.search.catalogue import Exactness, GpuClass, avoided, gpu_class, load, starting_points
from vidtune.search.records import RecordLog


def _spec(tmp_path: Path, *overrides: str):
    return Settings(load_config([f"results_dir={tmp_path}", "model=tiny", *overrides])).campaign_spec()


def test_gpu_classes_from_device_names():
    assert gpu_class("NVIDIA H200") is GpuClass.HOPPER and gpu_class("NVIDIA H100 80GB HBM3") is GpuClass.HOPPER
    assert gpu_class("NVIDIA A100-SXM4-80GB") is GpuClass.AMPERE and gpu_class("NVIDIA B200") is GpuClass.BLACKWELL
    assert gpu_class(None) is GpuClass.CPU and gpu_class("Some Future GPU") is GpuClass.OTHER_GPU
    assert gpu_class("cpu (x86_64)") is GpuClass.CPU  # (as search/baseline.py's environment names it)


def test_the_shipped_catalogue_is_valid_and_every_point_can_be_queued():
    points, avoids = load()
    assert points and avoids
    for point in points:
        mode = "multistep" if point.mode == "multistep" else "distilled"
        req = GenerationRequest(height=1024, width=1536, frames=121, mode=mode)
        parts = [seed_params(f, point.knobs, req)[0] for f in ("caching", "tiling", "kernel_choice", "sparse_attention")]
        assert any(parts), f"{point.name}: no family's search space can express it"
    hopper = starting_points(GpuClass.HOPPER, "distilled")
    assert [p.kind for p in hopper] == sorted(p.kind for p in hopper)  # exact first
    assert hopper[0].kind is Exactness.EXACT and "hopper-exact-ish" in [p.name for p in hopper]
    assert not [p for p in starting_points(GpuClass.CPU, "distilled")]  # nothing measured to win on a CPU


def test_a_catalogue_naming_what_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="catalogue point 'x'"):
        load("points: [{name: x, kind: exact, knobs: {kernel_choice.sdpa_backend: {video_self: fastest}}}]")
    with pytest.raises(Exception, match="nope"):
        load("avoid: [{technique: tiling.vae_tiles, knob: nope, in: [1]}]")


def test_known_losers_on_a_gpu_class():
    hopper = GpuClass.HOPPER
    assert avoided({"tiling.vae_tiles": {"spatial_px": 320}}, hopper).why.startswith("VAE tiles smaller")
    assert avoided({"tiling.vae_tiles": {"spatial_px": 768}}, hopper) is None
    assert avoided({"tiling.vae_tiles": {"spatial_px": 320}}, GpuClass.CPU) is None  # measured on the H200 only
    sol = {"sparse_attention.sol": {"beta": 1.0, "backend": "reference"}}
    assert avoided(sol, GpuClass.AMPERE) and not avoided(sol, GpuClass.CPU)


def test_a_new_study_queues_the_catalogue_first(tmp_path):
    spec = _spec(tmp_path, "name=ms", "request.mode=multistep", "request.steps=6", "families=[caching,kernel_choice]")
    lines: list[str] = []
    studies = Campaign(spec, log=lines.append)._studies()
    waiting = {f: s.get_trials(states=(optuna.trial.TrialState.WAITING,)) for f, s in studies.items()}
    assert waiting["caching"][0].user_attrs["seeded_from"].startswith("catalogue multistep-exact-passes (exact)")
    assert waiting["caching"][0].params == {"caching.stg_prefix.use": True, "caching.stg_prefix.enabled": True} or \
        waiting["caching"][0].system_attrs["fixed_params"]["caching.stg_prefix.enabled"] is True
    assert any("queued first: catalogue multistep-exact-passes" in line for line in lines)
    # after the catalogue's points: each caching technique with a direction probed at its fast end
    probes = [t.user_attrs["probe"] for t in waiting["caching"] if "probe" in t.user_attrs]
    assert probes == ["caching.fewer_steps", "caching.first_block", "caching.guidance_cache", "caching.step_skip",
                      "caching.teacache"]
    assert all("probe" in t.user_attrs for t in waiting["caching"][-len(probes):])
    off = _spec(tmp_path, "name=ms-off", "request.mode=multistep", "request.steps=6", "families=[caching]",
                "catalogue=false", "probes=false")
    assert not Campaign(off, log=lambda *_: None)._studies()["caching"].get_trials(
        states=(optuna.trial.TrialState.WAITING,))


def _earlier_campaign(tmp_path: Path, name: str, request: list[str]) -> Path:
    """An earlier campaign's files as `vidtune campaign` writes them (spec, baseline meta, records)."""
    spec = _spec(tmp_path, f"name={name}", "families=[caching,tiling]", *request)
    save_spec(spec)
    (spec.directory / "baseline").mkdir()
    (spec.directory / "baseline" / "meta.json").write_text(json.dumps({"environment": {"device": None}}))
    log = RecordLog(spec.directory / "trials.jsonl")

    def record(trial: int, family: str, knobs: dict, interval: list[float], constraints: list[float]) -> None:
        log.append({"family": family, "trial": trial, "status": "ok", "knobs": knobs, "constraints": constraints,
                    "paired": {"ratio": sum(interval) / 2, "interval": interval}})

    record(0, "caching", {"caching.step_skip": {"every": 2, "first_kept": 2, "last_kept": 1, "stage": "stage1"}},
           [0.70, 0.80], [-1.0])  # won
    record(1, "caching", {"caching.step_skip": {"every": 3, "first_kept": 2, "last_kept": 1, "stage": "stage1"}},
           [0.60, 0.70], [2.0])  # faster, but outside its gate: not a winner
    record(2, "tiling", {"tiling.vae_tiles": {"spatial_px": 128}}, [1.10, 1.20], [-1.0])  # lost, alone
    log.append({"family": "tiling", "trial": 3, "status": "fail", "reason": "oom"})
    return spec.directory


def test_earlier_campaigns_of_the_same_model_and_gpu_class_are_priors_on_any_request(tmp_path):
    _earlier_campaign(tmp_path, "first", ["request.height=256", "request.width=384"])
    spec = _spec(tmp_path, "name=second", "request.height=128", "request.width=192", "request.frames=9",
                 "families=[caching,tiling]")
    lines: list[str] = []
    campaign = Campaign(spec, log=lines.append)
    assert [f.origin for f in campaign.findings()] == ["first:caching#0", "first:caching#1", "first:tiling#2"]
    assert "knowledge base: 3 measured setting(s) of 1 earlier campaign(s) of this model on this GPU class (first): " \
        "1 won, 1 lost, 0 ran out of memory" in lines
    studies = campaign._studies()
    queued = studies["caching"].get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs.get("seeded_from") for t in queued if "probe" not in t.user_attrs] == [
        "earlier campaign first:caching#0 (x1.333)"]
    assert "seeded_from" in queued[0].user_attrs  # (the probes come after it)
    # the loser is not drawn again: a sample holding it is pruned with the reason, the next one asked
    why = campaign.known_loser({"tiling.vae_tiles": {"spatial_px": 128}})
    assert why and "first:tiling#2" in why and campaign.known_loser({"tiling.vae_tiles": {"spatial_px": 768}}) is None
    study = optuna.create_study(directions=["minimize", "maximize"])
    study.enqueue_trial({"tiling.stage2_tiles.use": False, "tiling.vae_tiles.use": True,
                         "tiling.vae_tiles.spatial_px": 128, "tiling.vae_tiles.spatial_overlap_px": 64,
                         "tiling.vae_tiles.temporal_frames": 64, "tiling.vae_tiles.temporal_overlap_frames": 24})
    trial, setting, skipped = ask_effective(study, "tiling", spec.worker.request,
                                            reject=campaign.known_loser)
    assert skipped >= 1 and study.trials[0].user_attrs["reason"] == "known-loser"
    assert "first:tiling#2" in study.trials[0].user_attrs["why"]
    # the campaign's log line says what was declined and why (vidtune/jobs.py)
    from vidtune.jobs import skipped_reasons

    said = skipped_reasons(study, skipped)
    assert re.match(r"\d+ known to lose \(first: tiling\.vae_tiles .*first:tiling#2", said), said  # (the queued one first)
    # another model, or knowledge=false: nothing carried over
    other = Campaign(_spec(tmp_path, "name=third", "model=ltx2-mini"), log=lambda *_: None)
    assert other.findings() == []
    off = Campaign(_spec(tmp_path, "name=fourth", "knowledge=false"), log=lambda *_: None)
    assert off.findings() == [] and off.known_loser({"tiling.vae_tiles": {"spatial_px": 128}}) is None


def test_a_setting_that_ran_out_of_memory_is_not_drawn_again_on_a_request_as_large(tmp_path):
    """An earlier campaign's OOM (its record saying what the process held before it) prunes the same setting in a
    later campaign whose request is at least as large (same mode) under a cap no larger; a smaller request, a
    superset of the setting (a technique added may lower the peak), or an OOM without the record's memory (a
    process an earlier failure had left full) are measured."""
    folder = _earlier_campaign(tmp_path, "first", ["request.height=256", "request.width=384", "request.frames=17"])
    oom = {"tiling.vae_tiles": {"spatial_px": 256, "spatial_overlap_px": 64, "temporal_frames": 64,
                                "temporal_overlap_frames": 24}}
    RecordLog(folder / "trials.jsonl").append({"family": "tiling", "trial": 4, "status": "fail", "reason": "oom",
                                               "knobs": oom, "memory": {"cap_gib": None, "held_before_gib": 0.5}})
    unknown = {"tiling.vae_tiles": {"spatial_px": 320, "spatial_overlap_px": 64, "temporal_frames": 64,
                                    "temporal_overlap_frames": 24}}
    RecordLog(folder / "trials.jsonl").append({"family": "tiling", "trial": 5, "status": "fail", "reason": "oom",
                                               "knobs": unknown})  # (no memory: not counted)

    def why(name: str, *request: str, setting: dict = oom) -> str | None:
        return Campaign(_spec(tmp_path, f"name={name}", "families=[caching,tiling]", *request),
                        log=lambda *_: None).known_loser(setting)

    same = ["request.height=256", "request.width=384", "request.frames=17"]
    assert "ran out of memory in first:tiling#4" in (why("same", *same) or "")
    assert "ran out of memory in first:tiling#4" in (why("larger", "request.height=320", "request.width=512",
                                                         "request.frames=17") or "")
    assert why("smaller", "request.height=128", "request.width=192", "request.frames=17") is None
    assert why("multistep", *same, "request.mode=multistep") is None
    assert why("superset", *same, setting={**oom, "tiling.stage2_tiles": {"rows": 2, "cols": 2, "overlap": 8}}) is None
    assert why("unknown", *same, setting=unknown) is None
    assert why("off", *same, "knowledge=false") is None


def test_a_knob_value_that_lost_alone_is_not_drawn_again_beside_other_knobs(tmp_path):
    """For a technique whose knobs cost each on its own (the SDPA backend per attention kind), a value that measured
    slower than the baseline with every other knob off is not drawn again whatever the other knobs say; for one
    whose knobs act together (VAE tiles), only the same whole setting is a known loser."""
    folder = _earlier_campaign(tmp_path, "first", ["request.height=256", "request.width=384"])
    RecordLog(folder / "trials.jsonl").append(
        {"family": "kernel_choice", "trial": 7, "status": "ok", "constraints": [-1.0],
         "knobs": {"kernel_choice.sdpa_backend": {"video_self": "math"}},
         "paired": {"ratio": 1.4, "interval": [1.3, 1.5]}})
    campaign = Campaign(_spec(tmp_path, "name=second", "families=[kernel_choice,tiling]"), log=lambda *_: None)
    why = campaign.known_loser({"kernel_choice.sdpa_backend": {"video_self": "math", "audio_self": "flash"}})
    assert why and "video_self=math" in why and "first:kernel_choice#7" in why
    assert campaign.known_loser({"kernel_choice.sdpa_backend": {"video_self": "flash", "audio_self": "math"}}) is None
    # (the tiles' loser of the earlier campaign, 128 px with its overlaps, prunes only itself)
    assert campaign.known_loser({"tiling.vae_tiles": {"spatial_px": 128, "spatial_overlap_px": 32}}) is None
