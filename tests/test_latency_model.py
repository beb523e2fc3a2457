"""The latency model (search/latency_model.py): which settings it can estimate, its step classes and arithmetic, the
captured passes, and an estimate of a known per-pass cost on the tiny preset; the evaluator's estimate rung."""

from __future__ import annotations

import dataclasses

import time

import pytest
import torch

from vidtune.model import ModelSource, ReferencePipeline
from vidtune.search.evaluator import ensure_baseline, evaluate_paired
from vidtune.search.latency_model import capture_passes, estimate, estimator, not_modelled, predict, step_classes
from vidtune.techniques import Knob, Patch, Technique, register
from vidtune.techniques.registry import unregister
from vidtune.techniques.setting import Setting

SLEEP_S = 0.5  # added to each pass the test technique acts on: well above a tiny pass's spread on a loaded CPU


@pytest.fixture()
def slow_passes():
    """A test-only technique that adds SLEEP_S to every transformer pass of its stage from step ``after`` on."""

    @register("kernel_choice.test_slow_pass")
    class SlowPass(Technique):
        knobs = (Knob("stage", "categorical", off="off", choices=("off", "stage1", "stage2")),
                 Knob("after", "int", off=0, low=0, high=8))
        switch = "stage"
        seams = ("transformer.pass",)
        composes_with = {"caching.step_skip": "test only: the sleep wraps whatever pass function it finds"}

        def stages_for(self, values):
            return (values["stage"],)

        def pass_steps(self, values, stage):
            return values["after"]

        def apply_active(self, pipeline, values):
            patch = Patch(self.name)
            original = pipeline.transformer_pass

            def transformer_pass(video, audio, perturbations):
                ctx = pipeline.context
                if ctx.stage == values["stage"] and ctx.step >= values["after"]:
                    time.sleep(SLEEP_S)
                return original(video, audio, perturbations)

            patch.set_attr(pipeline, "transformer_pass", transformer_pass)
            return patch

    yield "kernel_choice.test_slow_pass"
    unregister("kernel_choice.test_slow_pass")


@pytest.fixture()
def baseline(tmp_path, tiny_models, tiny_request):
    pipe = ReferencePipeline(tiny_models)
    base, _ = ensure_baseline(pipe, tiny_request, ModelSource(preset="tiny"), tmp_path / "baseline", repeats=2,
                              warmup=0, noise_floor=False, mp4=False)
    return pipe, base


def test_settings_it_cannot_estimate_say_why_and_step_classes_split_at_dense_steps():
    assert not_modelled(Setting.of({"kernel_choice.fp8_linear": {"layers": "all"}})) is None
    assert not_modelled(Setting.of({"kernel_choice.compile": {"mode": "default"}})) is None
    assert not_modelled(Setting.of({"caching.step_skip": {"every": 2}})) is None  # (a counted cache)
    why = not_modelled(Setting.of({"caching.step_skip": {"every": 2}, "caching.teacache": {"threshold": 0.1}}))
    assert why and "both cache passes of stage1" in why
    assert "fewer_steps" in not_modelled(Setting.of({"caching.fewer_steps": {"fraction": 0.5}}))
    assert "stage2_tiles" in not_modelled(Setting.of({"tiling.stage2_tiles": {"rows": 2, "cols": 2}}))
    assert "upsampler" in not_modelled(Setting.of({"memory.stage_placement": {"upsampler": True}}))
    sol = Setting.of({"sparse_attention.sol": {"beta": 0.5, "dense_steps": 1}})
    assert step_classes(sol, "stage2", 3) == [(0, 1), (1, 2)]
    assert step_classes(Setting.of({"sparse_attention.sol": {"beta": 0.5}}), "stage2", 3) == [(0, 3)]
    # dense for every step of the stage: one class (the technique leaves the stage as it is)
    assert step_classes(Setting.of({"sparse_attention.token_merge": {"spatial": 2, "dense_steps": 3}}), "stage2", 3) == [(0, 3)]


def test_the_prediction_sums_the_stages_and_never_goes_below_zero():
    base = {"stage1": 100.0, "stage2": 300.0, "decode_video": 600.0}
    est = predict(base, {**base, "stage2": 150.0, "decode_video": 300.0}, {"stage2": {}, "decode_video": {}}, 3)
    assert est["ratio"] == pytest.approx(550.0 / 1000.0)
    assert est["latency"]["stage1"]["source"] == "baseline" and est["latency"]["stage2"]["source"] == "estimate"
    assert predict(base, {**base, "stage1": -50.0}, {"stage1": {}}, 3)["total_ms"] == pytest.approx(900.0)


def test_a_captured_pass_replays_the_stages_pass_at_its_middle_step(baseline, tiny_request):
    """The inputs held for each denoising stage are its middle step's pass's: replayed, they give that pass's
    output in a whole run."""
    pipe, base = baseline
    captured = capture_passes(pipe, tiny_request, base.stages)
    assert set(captured) == {"stage1", "stage2"}
    assert captured["stage1"]["context"].num_steps == 8 and captured["stage2"]["context"].num_steps == 3
    assert captured["stage1"]["passes_per_step"] == 1
    assert captured["stage1"]["context"].step == 4 and captured["stage2"]["context"].step == 1
    assert "transformer_pass" not in vars(pipe) and pipe.context is None  # (the pipeline left as it was)
    firsts = {}
    original = pipe.transformer_pass

    def keep(video, audio, perturbations):
        out = original(video, audio, perturbations)
        if pipe.context.step == pipe.context.num_steps // 2:
            firsts.setdefault(pipe.context.stage, out)
        return out

    pipe.transformer_pass = keep
    pipe.run(tiny_request)
    del pipe.transformer_pass
    with torch.inference_mode():
        for stage, c in captured.items():
            pipe.context = c["context"]
            replayed = pipe.transformer_pass(*c["args"])
            pipe.context = None
            assert torch.equal(replayed[0], firsts[stage][0]) and torch.equal(replayed[1], firsts[stage][1]), stage


def test_the_estimate_finds_a_known_cost_per_pass(baseline, tiny_request, slow_passes):
    """SLEEP_S more on every stage-1 pass, then on stage 2's passes from its second step: the estimate finds it on
    the passes the technique acts on (8, then 2 of 3), nothing on the step it leaves alone, and adds it to the
    whole generation. (A sleep on a loaded CPU can only wake late: the upper bound is loose.)"""
    pipe, base = baseline
    total = sum(v["median_ms"] for v in base.latency.values())
    captured = capture_passes(pipe, tiny_request, base.stages)
    sleep_ms = SLEEP_S * 1e3
    for stage, knobs, passes in (("stage1", {"stage": "stage1"}, 8), ("stage2", {"stage": "stage2", "after": 1}, 2)):
        est = estimate(pipe, tiny_request, Setting.of({slow_passes: knobs}), base, pairs=3, captured=captured)
        classes = est["measured"][stage]["pass"]
        after = knobs.get("after", 0)
        assert [(c["first_step"], c["steps"]) for c in classes] == ([(0, 8)] if after == 0 else [(0, 1), (1, 2)])
        assert sum(c["passes"] for c in classes if c["first_step"] >= after) == passes
        for c in classes:
            added = c["setting_ms"] - c["baseline_ms"]
            assert (0.7 * sleep_ms <= added <= 2 * sleep_ms) if c["first_step"] >= after else abs(added) < sleep_ms / 2, c
        k = est["measured"][stage]["scale"]
        assert 0 < k <= 1
        whole = k * sum(c["passes"] * (c["setting_ms"] - c["baseline_ms"]) for c in classes)
        assert est["ratio"] * total - total == pytest.approx(whole, abs=1.0)  # (the scale is rounded to 4 digits)


def test_a_counted_cache_saves_its_cached_passes_at_the_settings_pass_cost(baseline, tiny_request, slow_passes):
    """Step skip (every 2nd step of stage 1) with SLEEP_S on every stage-1 pass: the estimate replays the pass
    without the cache (the slow pass) and takes the cached passes the setting's own run counted off at that cost;
    without the run's statistics it refuses. First-block caching's cached pass costs its probe blocks."""
    from vidtune.search.stages import run_from
    from vidtune.techniques.registry import get
    from vidtune.techniques.setting import compose

    pipe, base = baseline
    values = Setting.of({slow_passes: {"stage": "stage1"}, "caching.step_skip": {"every": 2}})
    patch = compose(pipe, values)
    try:
        out, _ = run_from(pipe, tiny_request, "stage1", None)
    finally:
        patch.undo()
    cached = out.stats["caching.step_skip"]["stage1"]["cached"]
    assert cached >= 2
    with pytest.raises(ValueError, match="run_stats"):
        estimate(pipe, tiny_request, values, base, pairs=1)
    est = estimate(pipe, tiny_request, values, base, pairs=3, run_stats=out.stats)
    stage1 = est["measured"]["stage1"]
    assert stage1["cache"] == {"technique": "caching.step_skip", "cached_passes": cached, "cached_pass_cost": 0.0}
    (c,) = stage1["pass"]
    assert 0.7 * SLEEP_S * 1e3 <= c["setting_ms"] - c["baseline_ms"] <= 2 * SLEEP_S * 1e3  # (the slow pass, uncached)
    expected = 0.0  # (every denoising stage the cache may act on is estimated: stage 2 too, with no cached pass)
    for stage, m in est["measured"].items():
        expected += m["scale"] * sum(k["passes"] * (k["setting_ms"] - k["baseline_ms"]) for k in m["pass"])
        expected -= m["scale"] * m["cache"]["cached_passes"] * m["pass"][-1]["setting_ms"]
    assert est["measured"]["stage2"]["cache"]["cached_passes"] == out.stats["caching.step_skip"]["stage2"]["cached"]
    s2 = est["measured"]["stage2"]["pass"][0]  # (only the cache acts on stage 2: no replayed difference there)
    assert s2["setting_ms"] == s2["baseline_ms"]
    added = est["total_ms"] - sum(base.latency[s]["median_ms"] for s in est["latency"])
    assert added == pytest.approx(expected, abs=1.0) and added < 8 * (c["setting_ms"] - c["baseline_ms"])
    fb = get("caching.first_block")
    assert fb.cached_pass_cost(fb.validate({"threshold": 0.1, "fn_blocks": 2}), 8) == pytest.approx(0.25)


def test_a_setting_the_estimate_rules_out_is_not_timed_and_one_it_keeps_is(baseline, tiny_request, slow_passes):
    pipe, base = baseline
    cache: dict = {}
    slow = Setting.of({slow_passes: {"stage": "stage2", "after": 1}})  # (SLEEP_S on 2 passes of a ~2 s generation)
    asked = []

    def prune(ratio, source="its first pair"):
        asked.append((ratio, source))
        return "slower" if ratio >= 1.0 else None

    ev = evaluate_paired(pipe, tiny_request, slow, baseline=base, repeats=2, max_repeats=2, warmup=1, prune=prune,
                         estimate=estimator(pipe, tiny_request, slow, base, cache, pairs=1))
    assert ev.paired["repeats"] == 0 and ev.paired["pruned"] == "slower" and not ev.paired["faster"]
    assert ev.paired["estimate"]["ratio"] > 1.2 and asked == [(pytest.approx(ev.paired["estimate"]["ratio"] / 1.06),
                                                                          "its estimate, 6% better,")]
    assert ev.latency["stage2"]["source"] == "estimate" and ev.latency["stage1"]["source"] == "baseline"
    assert ev.quality is not None
    assert ev.total_ms == pytest.approx(ev.paired["estimate"]["total_ms"])
    # a setting the estimate leaves in the race gets its pairs, the estimate recorded beside them
    ev = evaluate_paired(pipe, tiny_request, slow, baseline=base, repeats=2, max_repeats=2, warmup=1, prune=lambda r, s="": None,
                         estimate=estimator(pipe, tiny_request, slow, base, cache, pairs=1))
    assert ev.paired["repeats"] == 2 and "pruned" not in ev.paired and ev.paired["estimate"]["ratio"] > 1.2
    assert "passes" in cache  # (captured once, for both)
    # decoders only: no estimate (the stage-scoped pair runs the decoders alone already)
    assert estimator(pipe, tiny_request, Setting.of({"kernel_choice.vae_decode": {"channels_last": True}}), base,
                     cache) is None


def test_the_benchmark_compares_the_estimate_with_whole_generations(tmp_path):
    from vidtune.benchmarks.latency_model import main

    out = tmp_path / "lm.json"
    assert main(["--preset", "tiny", "--size", "128x192x9", "--pairs", "2", "--out", str(out), "--lean",
                 "--baseline-dir", str(tmp_path / "b"), "--variant", "math=kernel_choice.sdpa_backend.video_self=math",
                 "--variant", "two=caching.step_skip.every=2,caching.teacache.threshold=0.1"]) == 0
    import json

    res = json.loads(out.read_text())
    math, two = res["variants"]
    assert math["estimated"] > 0 and math["measured"] > 0
    assert math["error"] == pytest.approx(math["estimated"] / math["measured"] - 1)
    assert set(math["estimate_detail"]) == {"stage1", "stage2"} and "not_modelled" in two
    assert res["median_abs_error"] == pytest.approx(abs(math["error"]))
    # --lean: the same setting estimated again without the untimed round and passes
    assert math["error_lean"] == pytest.approx(math["estimated_lean"] / math["measured"] - 1)
    assert res["worst_abs_error_lean"] == pytest.approx(abs(math["error_lean"]))


def test_an_estimate_is_not_carried_to_later_campaigns_as_a_measurement():
    from vidtune.search.knowledge import _finding
    from vidtune.techniques.knobs import KnobError

    rec = {"family": "kernel_choice", "status": "ok", "trial": 3, "knobs": {"kernel_choice.sdpa_backend": {"video_self": "math"}},
           "paired": {"ratio": 1.3, "interval": [1.3, 1.3], "repeats": 0, "pruned": "slower"}}
    same = lambda knobs, source, target: (knobs, None)  # noqa: E731  (the same geometry)
    assert _finding("c", rec, {}, {}, same, KnobError) is None
    rec["paired"].update(repeats=2, interval=[1.2, 1.4])
    assert _finding("c", rec, {}, {}, same, KnobError).lost


def test_a_campaign_worker_with_eval_estimate_stops_a_trial_at_its_estimate(tmp_path):
    """``eval.estimate=true``: a family trial (a front given) that its estimate shows cannot join the front stops
    before any pair (``record``: it gets its pairs, the estimate beside them); the config refuses anything else,
    naming the field."""
    from vidtune.cli import Settings, load_config
    from vidtune.search.campaign import Gate
    from vidtune.search.worker import TrialWorker, WorkerSpec
    from vidtune.settings import CliError

    with pytest.raises(CliError, match="eval.estimate must be true, false, trust or record"):
        Settings(load_config([f"results_dir={tmp_path}", "eval.estimate=maybe"]))
    st = Settings(load_config([f"results_dir={tmp_path}", "eval.repeats=2", "eval.max_repeats=2", "eval.warmup=1",
                               "eval.estimate=true", "model=tiny", "request.height=128", "request.width=192",
                               "request.frames=9", "name=e"]))
    worker = TrialWorker(WorkerSpec(**st.worker_spec()))
    worker.ensure_baseline()
    open_ = Gate(psnr_db=None, ssim=None, audio_snr_db=None)
    knobs = {"kernel_choice.sdpa_backend": {"video_self": "math"}}
    try:
        stopped = worker.evaluate(knobs, screen=open_, front=[(0.001, 1000.0)])  # (a survivor of 1000 dB at 1 us)
        unfronted = worker.evaluate(knobs, screen=open_)  # (no front: not a family trial, never estimated)
        worker.spec = dataclasses.replace(worker.spec, estimate="record")  # (eval.estimate=record)
        recorded = worker.evaluate(knobs, screen=open_, front=[(0.001, 1000.0)])
        worker.spec = dataclasses.replace(worker.spec, estimate="trust")  # (eval.estimate=trust; a probe: no front)
        skip = {"caching.step_skip": {"every": 2, "first_kept": 1, "last_kept": 1, "stage": "both"}}  # (clearly faster)
        trusted = worker.evaluate(skip, screen=open_, front=[])
    finally:
        worker.close()
    # trust: not stopped (not slower than the baseline beyond the model's error), recorded at its estimate, no pair;
    # its interval the model's error, so it is a survivor only where faster beyond it
    tp = trusted["paired"]
    assert tp["repeats"] == 0 and "pruned" not in tp and tp["estimate"]["trust"] and trusted["quality"], tp
    assert tp["interval"][0] < tp["ratio"] < tp["interval"][1] and tp["faster"]  # (faster beyond the 6% margin)
    # record: the estimate stops nothing (its first pair does, against that front), recorded beside the pair
    assert recorded["paired"]["repeats"] == 1 and recorded["paired"]["pruned"].startswith("its first pair")
    assert recorded["paired"]["estimate"]["ratio"] == pytest.approx(stopped["paired"]["estimate"]["ratio"], rel=0.5)
    assert stopped["status"] == "ok" and stopped["paired"]["repeats"] == 0, stopped.get("paired")
    assert stopped["paired"]["estimate"]["measured"].keys() == {"stage1", "stage2"} and stopped["quality"]
    assert "estimate" not in unfronted["paired"] and unfronted["paired"]["repeats"] == 2


def test_a_survivor_recorded_at_its_estimate_is_measured_by_the_integrator(tmp_path):
    """(eval.estimate=trust) The integrator counts a survivor's trial as its one-family combination only where the
    trial was measured in pairs; one recorded at its estimate is left to be measured."""
    from vidtune.cli import Settings, load_config
    from vidtune.driver import Campaign

    spec = Settings(load_config([f"results_dir={tmp_path}", "model=tiny", "name=t", "tiers=none"])).campaign_spec()
    campaign = Campaign(spec, log=lambda m: None)
    knobs = [{"caching.step_skip": {"every": e, "first_kept": 1, "last_kept": 1, "stage": "both"}} for e in (2, 3)]
    for trial, (k, repeats) in enumerate(zip(knobs, (3, 0))):
        campaign._append({"family": "caching", "trial": trial, "status": "ok", "knobs": k,
                          "paired": {"ratio": 0.8, "repeats": repeats}})
    front = [{"trial": i, "knobs": k, "total_ms": 1.0, "psnr_db": 40.0} for i, k in enumerate(knobs)]
    assert [k for k, _ in campaign._measured_survivors({"caching": front})] == [knobs[0]]


def test_a_campaigns_records_say_how_far_its_estimates_were_from_its_pairs():
    from vidtune.integrator.report import _estimates_text
    from vidtune.search.latency_model import estimate_errors

    records = [{"paired": {"ratio": 0.8, "repeats": 3, "estimate": {"ratio": 0.84}}},
               {"paired": {"ratio": 1.0, "repeats": 2, "estimate": {"ratio": 0.9}}},
               {"paired": {"ratio": 1.2, "repeats": 0, "estimate": {"ratio": 1.2}, "pruned": "slower"}},
               {"paired": {"ratio": 0.9, "repeats": 1, "estimate": {"ratio": 0.9}}},  # (one pair: not a reference)
               {"paired": {"ratio": 0.95, "repeats": 3}}, {"status": "fail"}]
    e = estimate_errors(records)
    assert (e["estimated"], e["stopped"], e["trusted"], e["measured"]) == (4, 1, 0, 2)
    assert e["median"] == pytest.approx((0.05 + 0.1) / 2) and e["worst"] == pytest.approx(0.1)
    assert estimate_errors(records[4:]) is None and _estimates_text(records[4:]) == ""
    text = _estimates_text(records)
    assert "4 trial(s) estimated, 1 stopped" in text and "median error 7.5%, worst 10.0%" in text
    trusted = {"paired": {"ratio": 0.7, "repeats": 0, "estimate": {"ratio": 0.7, "trust": True}}}  # (eval.estimate=trust)
    assert estimate_errors([*records, trusted])["trusted"] == 1 and estimate_errors([*records, trusted])["stopped"] == 1
    assert "5 trial(s) estimated, 1 stopped by their estimate, 1 recorded at it" in _estimates_text([*records, trusted])


def test_a_guided_step_counts_its_passes_as_run(tmp_path, tiny_models):
    """Multistep stage 1: the passes per step are counted on the steps before the captured one, as the
    pipeline runs them (four with every guidance term on, two with STG and the modality term off)."""
    from dataclasses import replace

    from vidtune.model.request import GenerationRequest

    pipe = ReferencePipeline(tiny_models)
    r = GenerationRequest(prompt="passes", seed=2, height=128, width=192, frames=9, mode="multistep", steps=4)
    for request, per_step in ((r, 4), (replace(r, stg_scale=0.0, modality_scale=1.0), 2)):
        out = pipe.run(request)
        assert out.stats["stage1.passes"] == 4 * per_step
        base, _ = ensure_baseline(pipe, request, ModelSource(preset="tiny"), tmp_path / f"b{per_step}", repeats=1,
                                  warmup=0, noise_floor=False, mp4=False)
        captured = capture_passes(pipe, request, base.stages)
        assert captured["stage1"]["passes_per_step"] == per_step and captured["stage2"]["passes_per_step"] == 1
