"""Tier verdicts over several clips (search/verdict.py, vidtune/verdicts.py): the grid, the worst-of rule, the
config's refusals, and a tier falling to its next candidate when its fastest setting does not hold on another
seed, measured on the real tiny model."""

from __future__ import annotations

import json

import pytest

from vidtune.search.spec import Gate
from vidtune.search.verdict import check_verdict_config, clip_grid, spread, worst

REQUEST = {"seed": 0, "prompt": "a red circle bouncing", "prompt_embedding": None}


def test_clip_grid_is_the_product_without_the_own_clip():
    assert clip_grid(REQUEST, [1], ["a green square bouncing"]) == [
        {"prompt": "a green square bouncing"}, {"seed": 1}, {"seed": 1, "prompt": "a green square bouncing"}]
    # repeats of the request's own seed or prompt add nothing
    assert clip_grid(REQUEST, [0, 1, 1], ["a red circle bouncing"]) == [{"seed": 1}]
    assert clip_grid(REQUEST, [], []) == []
    # a request given by an embedding keeps it: other prompts are left out
    assert clip_grid({**REQUEST, "prompt_embedding": "e.safetensors"}, [2], ["x"]) == [{"seed": 2}]


def test_verdict_config_refusals_name_the_field():
    clips, n = check_verdict_config({"seeds": [1], "prompts": ["p"], "candidates": 2}, REQUEST)
    assert n == 2 and len(clips) == 3
    assert check_verdict_config(None, REQUEST) == ((), 6)
    for bad, field in (({"seeds": "1"}, "verdict.seeds"), ({"seeds": [-1]}, "verdict.seeds"),
                       ({"seeds": [True]}, "verdict.seeds"), ({"prompts": [""]}, "verdict.prompts"),
                       ({"prompts": "p"}, "verdict.prompts"), ({"candidates": 0}, "verdict.candidates"),
                       ({"sedes": [1]}, "unknown field")):
        with pytest.raises(ValueError, match=field):
            check_verdict_config(bad, REQUEST)


def test_worst_takes_each_metric_at_its_worst():
    a = {"psnr_db": 40.0, "ssim": 0.99, "flip_worst": 0.02, "av_offset_ms": 3.0, "identical": False}
    b = {"psnr_db": 36.0, "ssim": 0.995, "flip_worst": 0.08, "av_offset_ms": -9.0, "identical": False}
    w = worst([a, b])
    assert w == {"psnr_db": 36.0, "ssim": 0.99, "flip_worst": 0.08, "av_offset_ms": -9.0, "identical": False}
    assert not Gate(psnr_db=38.0, ssim=None, audio_snr_db=None).passes(w)
    # a metric one clip lacks is not shown to pass on every clip
    assert "flip_worst" not in worst([a, {"psnr_db": 50.0}])
    assert spread([a, b])["psnr_db"] == [36.0, 40.0]


def test_settings_carry_the_verdict_clips(tmp_path):
    from vidtune.cli import CliError, Settings, load_config

    st = Settings(load_config([f"results_dir={tmp_path}", "model=tiny", "name=v", "verdict.seeds=[3]",
                               "verdict.prompts=[]"]))
    assert st.campaign_spec().verdict_clips == ({"seed": 3},)
    with pytest.raises(CliError, match="verdict.candidates"):
        Settings(load_config([f"results_dir={tmp_path}", "model=tiny", "name=v", "verdict.candidates=0"])).campaign_spec()


class _Local:
    """The transport of the driver's actor pool, in this process: the real worker answers."""

    def __init__(self, worker):
        self.worker, self.calls = worker, 0

        class _Method:
            def remote(_, *args):
                self.calls += 1
                return self.worker.verdict(*args)

        self.verdict = _Method()
        self.actors = [self]

    @staticmethod
    def get(ref, tick=None):
        return ref


def test_a_tier_falls_to_the_candidate_that_holds(tmp_path):
    """The fastest candidate passes the tier's gate on the campaign's clip but not on another seed: the tier takes
    the next one, which holds on both, and a second call reads the recorded clips instead of measuring again."""
    from vidtune.cli import Settings, load_config
    from vidtune.driver import Campaign
    from vidtune.search.records import Status
    from vidtune.search.verdict import clip_quality
    from vidtune.search.worker import TrialWorker, WorkerSpec
    from vidtune.techniques.setting import Setting
    from vidtune.verdicts import hold_verdicts

    st = Settings(load_config([f"results_dir={tmp_path}", "eval.paired=false", "eval.repeats=1", "eval.warmup=0",
                               "model=tiny", "request.height=128", "request.width=192", "request.frames=9", "name=v"]))
    worker = TrialWorker(WorkerSpec(**st.worker_spec()))
    worker.ensure_baseline()
    lossy = Setting.of({"caching.step_skip": {"every": 1, "first_kept": 1, "last_kept": 1, "stage": "both"}})
    exact = Setting.of({"memory.chunked_ffn": {"chunk_tokens": 1024}})
    psnr = {s: clip_quality(worker, lossy, {"seed": s})["quality"]["psnr_db"] for s in (0, 1)}
    assert psnr[0] != psnr[1] and max(psnr.values()) < 100
    own, other = max(psnr, key=psnr.get), min(psnr, key=psnr.get)
    gate = Gate(psnr_db=(psnr[own] + psnr[other]) / 2, ssim=None, audio_snr_db=None)
    own_quality = {s: clip_quality(worker, k, {"seed": own})["quality"] for s, k in (("lossy", lossy), ("exact", exact))}
    evaluated = [{"knobs": lossy, "status": Status.OK, "total_ms": 10.0, "quality": own_quality["lossy"]},
                 {"knobs": exact, "status": Status.OK, "total_ms": 20.0, "quality": own_quality["exact"]}]
    from dataclasses import replace

    spec = replace(st.campaign_spec(), verdict_clips=({"seed": other},), tiers=(("high", gate),))
    campaign = Campaign(spec, log=lambda m: None)
    pool = _Local(worker)
    from vidtune.integrator.combine import ranked

    candidates = {"high": ranked([{**e, "passes_gate": gate.passes(e["quality"])} for e in evaluated])}
    choices, verdicts = hold_verdicts(campaign, pool, spec.tiers, candidates)
    assert choices["high"] == exact, verdicts
    v = verdicts["high"]
    assert v["clips"] == 2 and v["worst"]["psnr_db"] > gate.psnr_db
    assert [d["knobs"] for d in v["did_not_hold"]] == [lossy]
    assert v["did_not_hold"][0]["worst"]["psnr_db"] == pytest.approx(psnr[other])
    assert pool.calls == 2
    records = [json.loads(line) for line in (spec.directory / "trials.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in records] == ["verdict", "verdict"]
    # resumed: the recorded clips are read, nothing is measured again
    again = _Local(worker)
    assert hold_verdicts(Campaign(spec, log=lambda m: None), again, spec.tiers, candidates)[0] == choices
    assert again.calls == 0
    # one candidate allowed: with the clips recorded the second candidate costs nothing and is taken; in a campaign
    # that has measured nothing the tier exports the baseline rather than a setting that does not hold
    one = replace(spec, verdict_candidates=1)
    assert hold_verdicts(Campaign(one, log=lambda m: None), again, one.tiers, candidates)[0]["high"] == exact
    assert again.calls == 0
    fresh = replace(one, name="v1")
    assert hold_verdicts(Campaign(fresh, log=lambda m: None), again, fresh.tiers, candidates)[0]["high"] == {}
    assert again.calls == 1
    # a candidate holding every knob of one that did not hold is not measured: the next one is
    both = Setting.of({**lossy, **exact})
    ordered = {"high": [{"knobs": lossy, "quality": own_quality["lossy"]},
                        {"knobs": both, "quality": own_quality["lossy"]}, {"knobs": exact, "quality": own_quality["exact"]}]}
    two = replace(spec, verdict_candidates=2, name="v2")
    pool = _Local(worker)
    choices, verdicts = hold_verdicts(Campaign(two, log=lambda m: None), pool, two.tiers, ordered)
    assert choices["high"] == exact and pool.calls == 2
    assert [d["knobs"] for d in verdicts["high"]["did_not_hold"]] == [lossy, both]
    assert verdicts["high"]["did_not_hold"][1]["reason"].startswith("not measured: it holds every knob of")
    assert verdicts["high"]["did_not_hold"][1]["skipped"] and not verdicts["high"]["did_not_hold"][0].get("skipped")


def test_worker_specs_are_typed_from_their_json_form(tmp_path):
    """A worker spec as campaign_spec.json holds it (plain JSON) becomes typed: its model source, its request and its
    quality model's spec; a field nobody knows is refused by name."""
    import pickle

    from vidtune.cli import Settings, load_config
    from vidtune.model import GenerationRequest, ModelSource
    from vidtune.search.quality_model import QualitySpec
    from vidtune.search.worker import WorkerSpec

    st = Settings(load_config([f"results_dir={tmp_path}", "model=tiny", "name=t", "quality_model.model=ltx2-mini"]))
    stored = json.loads(json.dumps(st.worker_spec()))
    spec = WorkerSpec(**stored)
    assert isinstance(spec.source, ModelSource) and spec.source.preset == "tiny"
    assert isinstance(spec.request, GenerationRequest) and spec.request == st.request
    assert isinstance(spec.quality, QualitySpec) and spec.quality.source.preset == "ltx2-mini"
    assert spec.quality.request == st.quality_model[1] and spec.quality.geometry["target"]["depth"] == 3.0
    assert pickle.loads(pickle.dumps(spec)) == spec and WorkerSpec(**{**stored, "quality": spec.quality}) == spec
    with pytest.raises(ValueError, match=r"quality spec: unknown field\(s\) \['nope'\]"):
        WorkerSpec(**{**stored, "quality": {**stored["quality"], "nope": 1}})
    with pytest.raises(ValueError, match=r"unknown request field\(s\) \['nope'\]"):
        WorkerSpec(**{**stored, "request": {**stored["request"], "nope": 1}})


def test_a_looser_tier_takes_a_stricter_tiers_faster_setting_that_passes_its_gate():
    """stricter_if_faster: a looser tier exports a stricter tier's setting when it passes the looser gate on
    the worst over its verdict's clips and measured faster in the joint final bench; not when it fails that
    gate there (its campaign clip passing is not enough), is slower, or is the baseline; a tier whose own pick is
    the baseline compares against x1 (its speed-up against itself is noise)."""
    from vidtune.verdicts import stricter_if_faster

    loose = Gate(psnr_db=None, ssim=None, audio_snr_db=None, flip_worst=0.15)
    good = {"flip_worst": 0.02}

    def outcome(knobs, speedup, worst_flip=None):
        return {"chosen": knobs, "final": {"speedup": speedup, "quality": good}, "rejected": None,
                "verdict": {"worst": {"flip_worst": worst_flip}} if worst_flip is not None else None}

    own = outcome({"caching.step_skip": {"every": 2}}, 1.276)
    compile_ = outcome({"kernel_choice.compile": {"mode": "default"}}, 1.350, worst_flip=0.03)
    lines: list[str] = []
    took = stricter_if_faster("balanced", loose, own, {"lossless": compile_}, lines.append)
    assert took["chosen"] == compile_["chosen"] and took["final"]["speedup"] == 1.350
    assert len(lines) == 1 and "the lossless tier's" in lines[0] and "x1.350 against x1.276" in lines[0]
    # fails the looser gate on its worst clip (though its campaign clip, final's quality, passes)
    assert stricter_if_faster("balanced", loose, own, {"high": outcome({"a": 1}, 1.5, worst_flip=0.2)}, print) is own
    assert stricter_if_faster("balanced", loose, own, {"high": outcome({"a": 1}, 1.1)}, print) is own  # slower
    assert stricter_if_faster("balanced", loose, own, {"high": outcome({}, 1.6)}, print) is own  # the baseline
    # the own pick is the baseline, whose x1.22 against itself is noise: the stricter x1.08 is taken
    base = outcome({}, 1.22)
    assert stricter_if_faster("balanced", loose, base, {"high": outcome({"a": 1}, 1.08)}, print)["chosen"] == {"a": 1}
    # the fastest of several stricter tiers that pass
    both = {"lossless": compile_, "high": outcome({"b": 2}, 1.40, worst_flip=0.05)}
    assert stricter_if_faster("balanced", loose, own, both, print)["chosen"] == {"b": 2}
