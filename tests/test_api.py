"""The Python API (vidtune/api.py): a tuned config deployed in-process, as `vidtune generate --config` runs it."""

from __future__ import annotations

import pytest
import torch
import yaml

from vidtune.api import Deployment, campaign_results

SMALL = ["model=tiny", "request.height=128", "request.width=192", "request.frames=9"]
KNOBS = {"caching.step_skip": {"every": 2, "first_kept": 1, "last_kept": 1, "stage": "both"}}


def _config(tmp_path, knobs=KNOBS):
    from vidtune.settings import Settings, load_config

    settings = Settings(load_config([*SMALL, f"results_dir={tmp_path}"]))
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump({"vidtune_tuned_config": 1, "campaign": "by-hand", "knobs": knobs,
                                    "model": settings.source.identity(), "request": settings.request.to_dict(),
                                    "signoff": {"by": "a reviewer", "verdict": "approve", "note": "", "at": None}}))
    return path


def test_a_deployment_generates_with_the_tuned_knobs_and_takes_them_off_again(tmp_path):
    from vidtune.search.stages import run_from
    from vidtune.techniques import compose

    config = _config(tmp_path)
    with Deployment.load(config, [f"results_dir={tmp_path}"]) as d:
        assert (d.request.height, d.request.width, d.request.frames) == (128, 192, 9)  # (the config's request)
        assert d.notes == [] and d.knobs["caching.step_skip"]["every"] == 2
        tuned = d.generate()
        assert set(tuned.latency_ms) == {"stage1", "upsample", "stage2", "decode_video", "decode_audio"}
        assert d.pipeline.run_stats()["caching.step_skip"]["stage1"]["cached"] > 0
        other = d.generate(seed=5)
        assert other.request["seed"] == 5 and not torch.equal(other.frames, tuned.frames)
        with pytest.raises(ValueError, match="not request fields; allowed"):
            d.generate(sead=5)
        files = d.save(tuned, tmp_path / "out")
        assert all((tmp_path / "out" / n).is_file() for n in ("video.mp4", "output.safetensors")) and files["video"]
        pipeline = d.pipeline
    # the same as vidtune's pipeline with the knobs composed by hand (what `vidtune generate --config` runs)
    with compose(pipeline, d.knobs):
        by_hand, _ = run_from(pipeline, d.request, "stage1", None)
    assert torch.equal(by_hand.frames, tuned.frames)
    # closed: the knobs are off, the pipeline as loaded (every knob off = the plain pipeline)
    plain, _ = run_from(pipeline, d.request, "stage1", None)
    off = Deployment.load(None, [*SMALL, f"results_dir={tmp_path}"])
    assert torch.equal(off.generate().frames, plain.frames) and not torch.equal(plain.frames, tuned.frames)


def test_a_bad_config_or_request_is_refused_before_the_model_is_built(tmp_path):
    config = _config(tmp_path)
    with pytest.raises(ValueError, match="tuned and measured for another request"):
        Deployment.load(config, ["request.height=192", f"results_dir={tmp_path}"])
    bad = _config(tmp_path, {"caching.step_skip": {"every": 99}})
    with pytest.raises(ValueError, match="caching.step_skip"):
        Deployment.load(bad, [f"results_dir={tmp_path}"])
    with pytest.raises(ValueError, match="request.height must be a positive multiple of 64"):
        Deployment.load(None, ["model=tiny", "request.height=100"])
    with pytest.raises(ValueError, match="config: cannot read"):
        Deployment.load(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="no .*campaign.json; the campaign does not exist"):
        campaign_results("nothing", tmp_path)
