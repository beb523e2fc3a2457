"""Search campaigns on the default preset (ltx2-mini, trained) for real: Optuna journal storage, Ray actors,
resume, failures."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import warnings
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest
import yaml

from processes import kill_tagged
from vidtune.cli import Settings, load_config, main
from vidtune.integrator.combine import combo_key
from vidtune.integrator.tuned import TunedConfigError, load_tuned_config
from vidtune.driver import Campaign
from vidtune.pool import ActorPool
from vidtune.search.campaign import sample_family_setting
from vidtune.techniques import get
from vidtune.techniques.setting import check_composition

# (2 repeats cannot reach p <= 0.05: these campaigns accept on the median ratio; the shared finished_campaign
# runs with the default significance gate instead, and its test checks the decision against its repeats)
# (these time a setting alone, eval.paired=false: the shared finished_campaign runs the default paired ratios)
# a small request of the tiny model (a generation ~0.15 s on one core against ~0.5 s at the default 256x384x17)
SMALL = ["request.height=128", "request.width=192", "request.frames=9"]
FAST = ["eval.repeats=1", "eval.warmup=0", "eval.paired=false", "integrator.final_repeats=2", "integrator.max_p_value=1"]


def _spec(tmp_path: Path, *overrides: str, fast: list[str] = FAST):
    """A campaign spec of ``overrides``; under the single gate (tiers=none) unless they name the tiers: these
    tests check one mechanism each, and each tier's verdict and final bench would only add time (the tiers, the
    default, have tests of their own)."""
    tiers = [] if any(o.startswith("tiers=") for o in overrides) else ["tiers=none"]
    return Settings(load_config([f"results_dir={tmp_path / 'results'}", *tiers, *fast, *overrides])).campaign_spec()


@pytest.fixture(scope="module", autouse=True)
def _ray_loopback():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(autouse=True)
def _one_ray(_ray_loopback):
    """One local Ray for the module's in-process campaigns (their pools leave a Ray they did not start
    running): ~6 s of start and shutdown saved per campaign on 2 cores. A test whose actors need a variable in
    their environment shuts it down first; the next test starts it again."""
    import ray

    from vidtune.pool import init_local_ray

    if not ray.is_initialized():
        _POOL.clear()  # (its actors ended with the Ray they ran on)
        init_local_ray(ray)
    yield


_POOL: dict[str, ActorPool] = {}


def _pool(spec) -> ActorPool:
    """The module's one pool, adopted for ``spec`` (``ActorPool.adopt``: the same actor process serves each
    campaign, made anew for it; ~7 s of an actor's start saved per campaign on 2 cores)."""
    if "pool" in _POOL:
        return _POOL["pool"].adopt(spec)
    _POOL["pool"] = ActorPool(spec)
    return _POOL["pool"]


def _pooled(spec, **kwargs) -> Campaign:
    """A campaign on the module's pool. Tests of the actors themselves (timeouts, a dead actor, their threads,
    the pool's own adoption) run on pools of their own."""
    return Campaign(spec, pool=_pool(spec), **kwargs)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sampling_never_offers_conflicting_techniques():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), directions=["minimize", "maximize"])
    from vidtune.model import GenerationRequest

    req = GenerationRequest()
    for family in ("caching", "tiling", "kernel_choice"):
        for _ in range(30):
            trial = study.ask()
            setting = sample_family_setting(trial, family, req)
            check_composition(setting)  # raises on a conflict
            from vidtune.techniques.setting import check_request

            check_request(setting, req)  # request-dependent limits respected by construction
            study.tell(trial, [1.0, 1.0])


def test_sampling_skips_settings_that_change_nothing():
    """Seen on the H200: a used technique with its switch off (compile mode=off crashed, cuda_graphs
    enabled=false), a cache whose warm-up covers every step, sparse attention dense on every stage-2 step.
    None of them is ever sampled; a trial whose whole setting would be a no-op is pruned, not measured."""
    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import ask_effective
    from vidtune.techniques import get, registered

    req = GenerationRequest()  # distilled: 8 stage-1 steps, 3 stage-2 steps
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1), directions=["minimize", "maximize"])
    for family in ("caching", "tiling", "kernel_choice", "sparse_attention"):
        for _ in range(60):
            trial = study.ask()
            for name, values in sample_family_setting(trial, family, req).items():
                tech = get(name)
                full = tech.validate(values)
                assert not tech.is_off(full) and tech.effective(full, req), (name, full)
            study.tell(trial, [1.0, 1.0])
    # the switches: off whatever the other knobs say, and never sampled once a technique is used
    with_switch = [t for t in registered() if t.switch]
    assert {"kernel_choice.compile", "kernel_choice.cuda_graphs", "sparse_attention.sol", "caching.step_skip"} <= {
        t.name for t in with_switch}
    compile_ = get("kernel_choice.compile")
    assert compile_.is_off({"mode": "off", "dynamic": False})
    assert compile_.apply(None, {"mode": "off", "dynamic": False}).label == "kernel_choice.compile"  # no pipeline touched
    for tech in (t for t in with_switch if t.applicable(req)):  # (parallel degrees need a world > 1)
        sampler = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
        for _ in range(25):
            t = sampler.ask()
            assert not tech.is_off(tech.suggest(t, req))
            sampler.tell(t, 0.0)
    # request-aware no-ops
    fbc, sol = get("caching.first_block"), get("sparse_attention.sol")
    assert not fbc.effective(fbc.validate({"threshold": 0.1, "warmup_steps": 7}), req)  # 8 steps: 0..7, last kept
    assert fbc.effective(fbc.validate({"threshold": 0.1, "warmup_steps": 6}), req)
    assert not sol.effective(sol.validate({"beta": 1.0, "dense_steps": 3}), req)
    assert sol.effective(sol.validate({"beta": 1.0, "dense_steps": 2}), req)
    # a whole no-op sample is pruned (reason no-op, not counted) and the next one is asked
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3), directions=["minimize", "maximize"])
    study.enqueue_trial({f"{t.name}.use": False for t in registered("caching")})
    trial, setting, skipped = ask_effective(study, "caching", req)
    assert skipped >= 1 and setting and trial.number == skipped  # the enqueued one and any random no-op after it
    assert all(t.state == optuna.trial.TrialState.PRUNED and t.user_attrs["reason"] == "no-op"
               for t in study.trials[:skipped])
    # and the sampler sees it as infeasible (Trial.set_constraint; TPE reads trial.constraints)
    assert all(t.constraints == {"0": 1.0, "1": 1.0, "2": 1.0} for t in study.trials[:skipped])


# the default significance gate (integrator.max_p_value=0.05), which 3 interleaved repeats can reach
E2E = ["name=e2e", "families=[caching,tiling]", "budget.trials_per_family=3", "gate.psnr_db=30", "seed=0",
       "integrator.final_repeats=3", *SMALL]
E2E_FAST = ["eval.repeats=2", "eval.max_repeats=4", "eval.warmup=0"]


@pytest.fixture(scope="module")
def finished_campaign(tmp_path_factory):
    """One real campaign on the default model (2 families x 3 trials) shared by the end-to-end, report and
    agent tests, at the small request (the default one took 8 minutes of setup on a loaded 2-core CI machine)."""
    tmp_path = tmp_path_factory.mktemp("campaign")
    spec = _spec(tmp_path, *E2E, fast=E2E_FAST)
    assert spec.integrator_max_p == 0.05
    lines: list[str] = []
    summary = _pooled(spec, log=lines.append).run()
    return tmp_path, spec, summary, lines


def test_search_plan_is_undone_after_the_campaign(tmp_path):
    """A campaign plans the actors' world and stage-2 tiling while it samples (Campaign.run, ask_trial), in
    context variables; afterwards the earlier plans come back, also when the block fails, and another thread
    never sees them."""
    import contextvars
    import threading

    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import search_plan
    from vidtune.techniques.parallelism import distributed as dist

    spec = _spec(tmp_path, "ray.ranks_per_actor=2", "eval.stage2_tiles.rows=1", "eval.stage2_tiles.cols=2")
    tile_parallel = get("parallelism.tile_parallel")
    # 128x192: one stage-2 tile by the reference default, two under the campaign's eval.stage2_tiles
    request = GenerationRequest(prompt="plan", seed=0, height=128, width=192, frames=9, fps=24.0)

    def check() -> None:
        dist.plan_world(3)
        assert dist.world_size() == 3 and not tile_parallel.effective({"degree": 2}, request)
        with pytest.raises(RuntimeError, match="inside"):
            with search_plan(spec):
                assert dist.world_size() == 2 and tile_parallel.effective({"degree": 2}, request)
                seen: list = []
                thread = threading.Thread(target=lambda: seen.append(dist.world_size()))
                thread.start()
                thread.join()
                assert seen == [1]  # (another thread: no plan)
                raise RuntimeError("inside")
        assert dist.world_size() == 3 and not tile_parallel.effective({"degree": 2}, request)

    contextvars.copy_context().run(check)  # (the plan of 3 stays in that copy)
    assert dist.world_size() == 1


def test_default_campaign_end_to_end(finished_campaign):
    tmp_path, spec, summary, lines = finished_campaign
    d = spec.directory
    assert spec.worker.source.preset == "ltx2-mini"  # the default model: the shipped trained one
    assert (d / "baseline" / "video.mp4").is_file() and (d / "optuna.journal").is_file()
    # progress is visible, its ETA over every phase left; the baseline and the integrator say what they do
    assert any("ETA" in line and "integrator ~" in line and "final bench" in line for line in lines)
    assert lines[0].startswith("baseline: ")
    # the baseline: the driver shows its generations as the actor runs them (repeats + the noise floor's)
    assert [l.split(" (")[0] for l in lines if l.startswith("baseline: generation")] == [
        "baseline: generation 1/3", "baseline: generation 2/3", "baseline: generation 3/3"]
    assert summary["baseline"]["generations"] == 3
    # the per-trial framework overhead is measured and summarised (its size on a CPU is not asserted)
    o = summary["overhead"]
    assert o["evaluations"] >= 4 and 0 < o["framework_fraction_median"] <= o["framework_fraction_max"] < 1
    records = _records(d / "trials.jsonl")
    per_family = {f: [r for r in records if r["family"] == f] for f in ("caching", "tiling")}
    assert all(len(v) == 3 for v in per_family.values())
    for family, recs in per_family.items():  # seed 0: every family has measured trials, not only failures
        assert sum(r["status"] == "ok" for r in recs) >= 2, (family, [(r["status"], r.get("reason")) for r in recs])
    for r in per_family["caching"] + per_family["tiling"]:
        assert r["status"] in ("ok", "fail")
        if r["status"] == "ok":
            assert set(r["latency"]) == {"stage1", "upsample", "stage2", "decode_video", "decode_audio"}
            assert {"psnr_db", "ssim", "audio_snr_db"} <= set(r["quality"])
            assert r["total_ms"] > 0 and r["quality"]["psnr_db"] > 0
        else:
            assert r["reason"] and "message" in r
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(d / "optuna.journal")))
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert names == {"e2e:caching", "e2e:tiling"}
    # the quality gate reached the sampler: every completed trial's constraints are the gate's, as recorded
    done = [t for name in names for t in optuna.load_study(study_name=name, storage=storage).trials
            if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all([t.constraints[str(i)] for i in range(3)] == t.user_attrs["constraints"] for t in done)
    # the export exists, validates and applies
    tuned = d / "tuned.yaml"
    doc = yaml.safe_load(tuned.read_text())
    assert doc["signoff"] == {"by": None, "verdict": None, "note": None, "at": None}
    assert doc["environment"]["device"].startswith("cpu")
    # trials measured paired: ratios against interleaved baseline runs, their interval, adaptive repeats
    ok = [r for r in per_family["caching"] + per_family["tiling"] if r["status"] == "ok"]
    # a trial below the gate at its first output is not timed further (screened), one at or above it is
    screened = [r for r in ok if r.get("screened")]
    assert all("paired" not in r and not spec.gate.passes(r["quality"]) and
               r["screened"]["reason"].startswith("below the gate on this model: ") for r in screened)
    ok = [r for r in ok if not r.get("screened")]
    assert all(spec.gate.passes(r["quality"]) for r in ok)
    # (prune=true: a trial whose first pair shows it cannot join its family's survivors stops there; on a loaded
    # 2-core CPU a first pair can read slower than the baseline, seen in the fresh-clone CI of 9bd7986)
    pruned = [r for r in ok if r["paired"].get("pruned")]
    assert all(r["paired"]["repeats"] == 1 and r["paired"]["pruned"].startswith("its first pair") for r in pruned), \
        [r["paired"] for r in pruned]
    ok = [r for r in ok if not r["paired"].get("pruned")]
    assert all(2 <= r["paired"]["repeats"] <= 4 and len(r["paired"]["ratios"]) == r["paired"]["repeats"] for r in ok), \
        [r["paired"] for r in ok]
    assert all(r["paired"]["repeats"] == 4 or not r["paired"]["interval"][0] <= 1 <= r["paired"]["interval"][1]
               or r["paired"]["interval"][1] - r["paired"]["interval"][0] <= 0.04 for r in ok)
    survivors = [s for v in summary["survivors"].values() for s in v]
    by_trial = {(r["family"], r["trial"]): r for r in ok}
    assert all(by_trial[(f, s["trial"])]["paired"]["faster"] for f, v in summary["survivors"].items() for s in v)
    # survivors are the gated trials faster beyond the noise: on ltx2-mini the caching family's first_block
    # settings save 3-6% (ratios 0.94-0.97, upper bounds 0.98-0.99, seen), so on a loaded 2-core CPU their
    # intervals can straddle 1 and leave none (seen once in a full run); then there is nothing to combine.
    # The integrator's own path is covered on tiny with an open gate (the kill-in-the-integrator test).
    gated_faster = [r for r in ok if r["paired"]["faster"] and spec.gate.passes(r["quality"])]
    assert bool(survivors) == bool(gated_faster)
    assert bool(summary["integrator"]) == bool(survivors)
    if any(not e["reused_from"] for e in summary["integrator"]):  # combinations measured: progress shown
        assert any("combination(s) | ETA" in line for line in lines)
    if survivors:  # single survivors are their trials, not measured again
        assert any("single-family combination(s) are their family's trials" in line for line in lines)
    # the integrator's combinations that pass the gate and are faster beyond the noise; the fastest of
    # them was re-measured
    passing = [e for e in summary["integrator"] if e["passes_gate"] and e["faster"]]
    assert all(spec.gate.passes(e["quality"]) for e in passing)
    if passing:  # (a combination's own paired interval may straddle 1 on a loaded CPU: then none is chosen)
        # the fastest, or where it did not hold on the verdict's other clips (seeds, prompts), the next in order
        ranked = [e["knobs"] for e in sorted(passing, key=lambda e: e["total_ms"])]
        entries = (summary["verdict"] or {}).get("did_not_hold", [])
        not_held = [d["knobs"] for d in entries]
        assert ranked[:len(not_held)] == not_held
        candidate = summary["chosen"] or (summary["rejected"] or {}).get("knobs")
        if candidate:
            assert candidate == ranked[len(not_held)]
        else:
            measured = [d for d in entries if not d.get("skipped")]
            assert (len(not_held) == len(ranked) or len(measured) >= spec.verdict_candidates) and summary["tuned_config"]
    else:
        assert summary["chosen"] == {} and summary["rejected"] is None
    _check_export_against_its_repeats(doc, summary, spec)
    if summary["chosen"]:
        assert spec.gate.passes(summary["final"]["quality"])
    settings = Settings(load_config([f"results_dir={tmp_path / 'results'}", "name=e2e"]))
    assert load_tuned_config(tuned, settings.source)["knobs"] == doc["knobs"]
    assert main(["generate", f"results_dir={tmp_path / 'results'}", "name=e2e", *SMALL, f"out={tmp_path / 'gen'}",
                 "--config", str(tuned)]) == 0
    assert (tmp_path / "gen" / "video.mp4").is_file()


def _check_export_against_its_repeats(doc: dict, summary: dict, spec) -> None:
    """The exported speed-up and decision follow from the repeats the campaign measured: recomputed here
    (median ratio, one-sided Mann-Whitney U with scipy), a speed-up > 1 exported only where p <= max_p."""
    import statistics

    from scipy.stats import mannwhitneyu

    m = doc["measured"]
    base, tuned = m["baseline_total_ms"], m["tuned_total_ms"]
    assert len(base) == len(tuned) == spec.final_repeats and all(x > 0 for x in base + tuned)
    assert m["speedup"] == pytest.approx(statistics.median(base) / statistics.median(tuned))
    if doc["knobs"] and any(not get(n).is_off(v) for n, v in doc["knobs"].items()):  # a combination was exported
        p = mannwhitneyu(tuned, base, alternative="less", method="exact").pvalue
        assert m["p_value"] == pytest.approx(p) and p <= spec.integrator_max_p and m["speedup"] > 1
        assert summary["rejected"] is None
    else:  # the baseline was exported: the candidate (if any) is recorded with the numbers that sank it
        rejected = summary["rejected"]
        if rejected is not None:
            p = mannwhitneyu(rejected["tuned_total_ms"], rejected["baseline_total_ms"], alternative="less",
                             method="exact").pvalue
            assert rejected["p_value"] == pytest.approx(p)
            assert rejected["speedup"] < 1 or p > spec.integrator_max_p
            assert doc["rejected_candidate"]["knobs"] == rejected["knobs"]


def test_timeouts_are_recorded_and_the_campaign_goes_on(tmp_path):
    spec = _spec(tmp_path, "model=tiny", *SMALL, "name=slow", "families=[tiling]", "budget.trials_per_family=2",
                 "budget.trial_timeout_s=0.01", "eval.repeats=3")
    summary = Campaign(spec, log=lambda *_: None).run()
    records = [r for r in _records(spec.directory / "trials.jsonl") if r["family"] == "tiling"]
    assert len(records) == 2
    # an all-off sample is fast but still slower than 10 ms; invalid samples are rejected before running
    assert all(r["status"] == "fail" and r["reason"] in ("timeout", "invalid") for r in records)
    assert any(r["reason"] == "timeout" for r in records)
    assert summary["chosen"] == {}  # nothing feasible: the tuned config is the baseline


def test_a_campaign_killed_in_each_phase_resumes_without_losing_or_repeating_finished_work(tmp_path):
    """One campaign SIGKILLed three times, each run resuming the last: inside the baseline's generations (no
    half-made baseline is kept; the next run computes it whole), once a family trial is recorded (finished trials
    kept, never re-run; the interrupted ones failed as such and queued again with their parameters; the stored
    baseline reused as it was), and once the integrator's first combination is recorded (the families' trials and
    the recorded combinations kept, only the rest evaluated); the last run exports. (The tiny preset at 128x192x9
    with an open gate, so that every family has survivors: three families give at least four combinations, so the
    last kill lands before the last one.)"""
    results = tmp_path / "results"
    families = ("caching", "tiling", "sparse_attention")
    cmd = [sys.executable, "-m", "vidtune.cli", "campaign", "model=tiny", *SMALL, f"results_dir={results}", "name=k",
           f"families=[{','.join(families)}]", "budget.trials_per_family=3", "eval.repeats=3", "eval.warmup=0",
           "gate.psnr_db=0", "gate.ssim=0", "gate.audio_snr_db=-100", "eval.paired=false", "integrator.final_repeats=2",
           "integrator.max_p_value=1", "integrator.max_exhaustive=4", "integrator.trials=4", "tiers=none"]
    tag = f"VIDTUNE_KILL_TEST={tmp_path.name}-{os.getpid()}"
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "VIDTUNE_CACHE": os.environ.get("VIDTUNE_CACHE", str(tmp_path / "cache")), **dict([tag.split("=")])}
    d, log = results / "k", results / "k" / "trials.jsonl"

    def run_until(done, what: str, timeout: float = 300) -> str:
        err = tmp_path / f"err-{what}.txt"
        with open(err, "w") as f:
            proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=f)
            deadline = time.time() + timeout
            while time.time() < deadline and not done(err) and proc.poll() is None:
                time.sleep(0.02)
            assert proc.poll() is None, f"the campaign ended before {what}: {err.read_text()[-2000:]}"
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Ray processes,
            proc.wait()
            kill_tagged(tag)  # and a Ray worker outside its group (one went on to finish the baseline after its driver)
        return err.read_text()

    def records(polled: bool = False) -> list[dict]:
        try:
            return _records(log) if log.exists() else []
        except ValueError:  # (polled while a line is being written)
            if polled:
                return []
            raise

    def trials(polled: bool = False) -> list[dict]:
        return [r for r in records(polled) if r["family"] != "integrator"]

    def combos(polled: bool = False) -> list[dict]:
        return [r for r in records(polled) if r["family"] == "integrator" and r.get("phase") not in ("final", "verdict")]

    # 1. inside the baseline (4 generations of 0.1-0.15 s: the 20 ms polls of the actor's own progress file land the
    # kill inside them; the driver's stderr shows those lines up to half a second later, by which time a fast CPU
    # had finished the baseline: seen on a 2-core AVX512 EPYC)
    progress = d / "progress.log"
    run_until(lambda e: progress.exists() and "generation 2/4" in progress.read_text(), "the baseline's 2nd generation")
    assert not (d / "baseline" / "meta.json").exists()
    assert "baseline: generation 1/4 (the noise floor's, untimed)" in progress.read_text()
    # 2. the resume computes the baseline whole; killed once a trial is recorded
    err = run_until(lambda e: any(r["status"] == "ok" for r in trials(polled=True)), "a family trial")
    assert "baseline: generation 4/4" in err and "baseline reused" not in err
    meta = json.loads((d / "baseline" / "meta.json").read_text())
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(d / "optuna.journal")))
    studies = {f: optuna.load_study(study_name=f"k:{f}", storage=storage) for f in families
               if f"k:{f}" in optuna.get_all_study_names(storage)}
    finished = {(f, t.number): t.values for f, st in studies.items() for t in st.trials
                if t.state == optuna.trial.TrialState.COMPLETE}
    running = [(f, t.number) for f, st in studies.items() for t in st.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert finished
    # 3. the resume reuses the stored baseline; killed once a combination is recorded
    err = run_until(lambda e: bool(combos(polled=True)), "the integrator's first combination")
    assert "baseline reused" in err and "baseline: generation" not in err, err[-3000:]
    assert json.loads((d / "baseline" / "meta.json").read_text()) == meta
    before, trials_before = combos(), trials()
    assert not (d / "tuned.yaml").exists()
    # 4. the last run finishes
    res = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "baseline reused" in res.stderr and "baseline: generation" not in res.stderr
    for f in families:  # every family measured its trials once: interrupted ones do not count
        by_number = {t.number: t for t in optuna.load_study(study_name=f"k:{f}", storage=storage).trials}
        counted = [t for t in by_number.values() if t.state in (optuna.trial.TrialState.COMPLETE,
                   optuna.trial.TrialState.FAIL) and t.user_attrs.get("reason") != "interrupted"]
        assert len(counted) == 3, f
        for (family, number), values in finished.items():  # kept, never re-run
            if family == f:
                assert by_number[number].state == optuna.trial.TrialState.COMPLETE and by_number[number].values == values
        for family, number in running:  # interrupted: recorded, and its parameters queued again
            if family != f:
                continue
            assert by_number[number].user_attrs.get("reason") == "interrupted"
            requeued = [t for t in by_number.values() if t.user_attrs.get("requeued_from") == number]
            interrupted = by_number[number].params
            if not interrupted:  # the kill landed between ask and sampling: nothing to repeat
                assert not requeued
                continue
            assert requeued and all(requeued[0].params[k] == v for k, v in interrupted.items())
    assert f"{len(before)} recorded by an earlier run" in res.stderr and "combination(s) | ETA" in res.stderr, res.stderr
    after = combos()
    keys = [r["combo"] for r in after]
    assert len(keys) == len(set(keys))  # no combination evaluated twice
    assert len(after) > len(before) and after[:len(before)] == before  # the recorded ones kept as they were
    summary = json.loads((d / "campaign.json").read_text())
    measured = [e for e in summary["integrator"] if not e["reused_from"]]
    assert len(measured) == len(after)  # every recorded combination counts in the outcome
    # a single survivor is its family's trial: counted with that trial's measurement, never run as a combination
    reused = [e for e in summary["integrator"] if e["reused_from"]]
    assert reused and all(len({t.split(".")[0] for t in e["knobs"]}) == 1 for e in reused)
    assert not {combo_key(e["knobs"]) for e in reused} & set(keys)
    assert trials() == trials_before  # no trial re-run by the integrator's resume
    doc = yaml.safe_load((d / "tuned.yaml").read_text())
    # tiny's own numbers (no quality model): said to be none of a quality figure
    assert doc["quality_from"] == {"model": {"preset": "tiny"}, "random_weights": True,
                                   "note": "random weights: these quality numbers are not a quality figure"}


def test_a_campaign_on_random_weights_gates_on_the_quality_model(tmp_path):
    """model=tiny with quality_model.model=ltx2-mini: every measured trial's quality (what the gate and the
    sampler see) is the mini's at the mapped setting, the tuned config and the report say so, and tiny's own
    numbers are kept beside (without one, the kill-in-the-integrator test sees tiny's tuned config say its
    numbers are not a quality figure)."""
    spec = _spec(tmp_path, "model=tiny", *SMALL, "quality_model.model=ltx2-mini", "name=qm", "families=[sparse_attention]",
                 "budget.trials_per_family=2", "gate.psnr_db=0", "gate.ssim=0", "gate.audio_snr_db=-100")
    summary = _pooled(spec, log=lambda line: None).run()
    assert summary["baseline"]["quality_model"]["model"] == {"preset": "ltx2-mini"}
    ok = [r for r in _records(spec.directory / "trials.jsonl") if r["family"] == "sparse_attention" and r["status"] == "ok"]
    assert ok and all(r["quality_from"]["model"] == {"preset": "ltx2-mini"} and r["latency_model_quality"] for r in ok)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(spec.directory / "optuna.journal")))
    study = optuna.load_study(study_name="qm:sparse_attention", storage=storage)
    told = {t.number: t.values[1] for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert told and all(told[r["trial"]] == pytest.approx(r["quality"]["psnr_db"]) for r in ok if r["trial"] in told)
    doc = yaml.safe_load((spec.directory / "tuned.yaml").read_text())
    assert doc["quality_from"]["model"] == {"preset": "ltx2-mini"} and doc["quality_from"]["request"]["height"] == 128
    assert doc["measured"]["psnr_db"] == summary["final"]["quality"]["psnr_db"]
    text = (spec.directory / "report.html").read_text()
    assert "id='quality-from'" in text and "Quality numbers come from {&quot;preset&quot;: &quot;ltx2-mini&quot;}" in text


def test_the_search_compiles_with_static_shapes_only():
    """A campaign tunes one request: compile is sampled with static shapes (a dynamic compile trial of the 19B ran
    past its 420 s limit on the H200); dynamic stays a knob for a deployment set by hand."""
    tech = get("kernel_choice.compile")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        assert tech.suggest(study.ask())["dynamic"] is False
    assert tech.validate({"mode": "default", "dynamic": True})["dynamic"] is True


def test_a_time_budget_stops_the_families_and_keeps_the_final_bench(tmp_path):
    """budget.minutes: the families stop sampling once one more trial would leave too little for the integrator
    and the final bench (said in the log), far below their trial budget; the campaign still measures its final
    bench and exports. Without it the same campaign runs every trial."""
    lines: list[str] = []
    spec = _spec(tmp_path, "model=tiny", *SMALL, "name=budgeted",
                 "families=[caching,tiling]", "budget.trials_per_family=20", "budget.minutes=0.05", "gate.psnr_db=0",
                 "gate.ssim=0", "gate.audio_snr_db=-100")
    assert spec.time_budget_s == 3.0
    summary = _pooled(spec, log=lines.append).run()
    trials = [r for r in _records(spec.directory / "trials.jsonl")] if (spec.directory / "trials.jsonl").exists() else []
    trials = [r for r in trials if r["family"] != "integrator"]
    # (40 without the budget. On a CPU with fast bf16 a tiny trial takes ~0.1-1 s and some run; on one without
    # (an AVX2-only EPYC: bf16 convolutions ~90x slower) the first trial's estimate alone is over the 3 s. How many
    # fit depends on the machine's load, so the time they took is what is asserted: a count, < 10, failed on a
    # loaded CPU with 10 trials of ~0.2 s)
    walls = [(r.get("timing") or {}).get("wall_s") or r.get("wall_s") or 0.0 for r in trials]
    assert len(trials) < 40 and sum(walls) <= spec.time_budget_s
    assert any(line.startswith("time budget:") and "the families stop here" in line for line in lines)
    assert summary["final"]["speedup"] > 0 and (spec.directory / "tuned.yaml").is_file()
    assert not trials or Campaign(spec)._per_evaluation_s() > 0  # (from the records a later run reads)


def test_the_families_keep_budget_for_the_integrators_first_combinations_only(tmp_path):
    """budget.minutes: four families with a survivor each make 11 combinations; the families keep budget for the
    integrator's first RESERVED_COMBINATIONS (measured best-predicted first), not all 11: reserving every one
    stopped the families of h100-19b-1536h after 388 s of 1,080. With 690 s spent of 1,200 (final bench 180 s,
    trials of 70 s), one more trial fits beside 2 combinations (690 + 70 + 140 + 180 = 1,080) and not beside 11."""
    from vidtune.budget import RESERVED_COMBINATIONS
    from vidtune.jobs import FamilyTrials
    from vidtune.search.campaign import append_record

    spec = _spec(tmp_path, "model=tiny", "families=[caching]", "budget.minutes=20", "verdict.seeds=[]",
                 "verdict.prompts=[]")
    for i in range(10):  # 700 s of trials... less one that was cheaper: 690 s
        append_record(spec, {"family": "caching", "trial": i, "status": "ok", "knobs": {},
                             "timing": {"wall_s": 70.0 if i else 60.0}})
    c = Campaign(spec, log=lambda line: None)
    c.baseline_ms = 60_000.0 / spec.final_repeats
    fronts = [[{"trial": 0, "knobs": {t: {}}, "total_ms": 900.0, "psnr_db": 40.0}] for t in
              ("caching.first_block", "tiling.vae", "kernel_choice.sdpa", "sparse_attention.sol")]
    assert c._expected_combinations(fronts) == 11 and c._reserved_combinations(fronts) == RESERVED_COMBINATIONS == 2
    c._expected_combinations = lambda f: 11  # (what the four families' fronts make, checked above)
    assert c._final_bench_s() == 180.0 and c._per_evaluation_s() == 70.0
    assert not FamilyTrials(c, c._studies())._out_of_time()
    c._reserved_combinations = c._expected_combinations  # (the old reserve: every expected combination)
    assert FamilyTrials(c, c._studies())._out_of_time()
    # the verdict's other clips are kept as well: a baseline and an evaluation on each, at the quality model's time
    # per trial where the records have it, else at the baseline's length
    import dataclasses

    c.spec = dataclasses.replace(spec, verdict_clips=({"seed": 1}, {"prompt": "p"}, {"seed": 1, "prompt": "p"}))
    assert c._final_bench_s() == 180.0 + 3 * 2 * c.baseline_ms / 1000 and c._final_bench_s(1) == 180.0  # (the bench alone)
    append_record(spec, {"family": "caching", "trial": 10, "status": "ok", "knobs": {},
                         "timing": {"wall_s": 70.0, "quality_model_s": 4.0}})
    assert c._final_bench_s() == 180.0 + 3 * 2 * 4.0


def test_a_run_time_limit_pauses_between_evaluations_and_the_next_run_goes_on(tmp_path, capsys):
    """budget.run_minutes: a run starts nothing that would end past its limit; it pauses after what is in flight
    (exit 75 from the command line) in the families, then in the integrator, and each next run goes on from the
    records: no trial, combination or final bench measured twice, the export as without a limit."""
    from dataclasses import replace

    from vidtune.search.campaign import CampaignPaused

    args = [f"results_dir={tmp_path / 'results'}", *FAST, "model=tiny", "request.height=128", "request.width=192",
            "request.frames=9", "name=paused", "families=[caching,tiling]", "integrator.max_exhaustive=2",
            "integrator.trials=2", "budget.trials_per_family=2", "gate.psnr_db=0", "gate.ssim=0", "gate.audio_snr_db=-100", "tiers=none"]
    spec = _spec(tmp_path, *args[1 + len(FAST):])
    d = spec.directory
    # a limit shorter than any trial: the baseline (never split) is stored, then no trial starts
    assert main(["campaign", *args, "budget.run_minutes=0.0001"]) == 75
    assert "paused before the next trial" in capsys.readouterr().err
    assert (d / "baseline" / "meta.json").is_file() and not (d / "trials.jsonl").exists()

    def run_until(trigger, limit_s: float = 3600.0):
        """A run whose remaining time is taken away once a log line satisfies ``trigger``."""
        lines: list[str] = []
        campaign = _pooled(replace(spec, run_limit_s=limit_s), log=lines.append)

        def log(line: str) -> None:
            lines.append(line)
            if trigger(line):
                campaign.started -= 10 * limit_s

        campaign.log = log
        return campaign, lines

    campaign, lines = run_until(lambda line: line.startswith("caching 1/2"))  # after the first trial
    with pytest.raises(CampaignPaused, match="the next trial"):
        campaign.run()
    assert any(line.startswith("run time: the next trial") for line in lines)
    first = [r["trial"] for r in _records(d / "trials.jsonl")]
    assert len(first) == 1
    campaign, lines = run_until(lambda line: line.startswith("integrator: ") and "survivor(s)" in line)
    with pytest.raises(CampaignPaused):
        campaign.run()
    records = _records(d / "trials.jsonl")
    trials = [(r["family"], r["trial"]) for r in records if r["family"] != "integrator"]
    assert len(trials) == 4 and len(set(trials)) == 4 and ("caching", first[0]) in trials
    assert not any(r.get("phase") == "final" for r in records)  # paused before it
    summary = _pooled(spec, log=lambda line: None).run()
    records = _records(d / "trials.jsonl")
    assert [(r["family"], r["trial"]) for r in records if r["family"] != "integrator"] == trials
    combos = [r["combo"] for r in records if r["family"] == "integrator" and r.get("phase") not in ("final", "verdict")]
    assert len(combos) == len(set(combos))
    assert len([r for r in records if r.get("phase") == "final"]) == 1 + bool(summary.get("rejected"))
    assert (d / "tuned.yaml").is_file()


def test_trial_actors_use_their_share_of_the_cores(tmp_path):
    """Ray starts an actor of num_cpus=1 with OMP_NUM_THREADS=1: the pool gives each actor's torch its share of
    the host's cores instead (here one actor: all of them), so a CPU campaign's trials do not run on one thread."""
    from vidtune._compat import actor_threads, usable_cores
    from vidtune.pool import ActorPool

    cores = usable_cores()  # (this process's cores: a test worker is pinned to its share)
    assert actor_threads() == cores and actor_threads(2) == max(1, cores // 2) and actor_threads(10 * cores) == 1
    pool = ActorPool(_spec(tmp_path, "model=tiny", *SMALL))
    try:
        assert pool.threads == cores
        assert pool.get(pool.actors[0].threads.remote()) == cores
    finally:
        pool.shutdown()


def test_a_campaign_searches_the_memory_family_under_a_peak_memory_ceiling(tmp_path):
    """gate.peak_memory_gb: a trial whose measured peak is above the ceiling is infeasible for the sampler and
    never survives to the integrator, so with a ceiling below every setting's peak the export is the baseline; the
    records keep each trial's peak (whole run and per stage) for the report."""
    spec = _spec(tmp_path, "model=tiny", *SMALL, "name=mem",
                 "families=[memory]", "budget.trials_per_family=2", "gate.psnr_db=0", "gate.ssim=0",
                 "gate.audio_snr_db=-100", "gate.peak_memory_gb=0.01")
    assert spec.gate.peak_memory_gb == 0.01
    summary = _pooled(spec, log=lambda line: None).run()
    ok = [r for r in _records(spec.directory / "trials.jsonl") if r["family"] == "memory" and r["status"] == "ok"]
    assert ok and all(r["quality"]["peak_memory_gb"] > 0.01 and r["stats"]["peak_memory_bytes"] for r in ok)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(spec.directory / "optuna.journal")))
    study = optuna.load_study(study_name="mem:memory", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and not any(t.user_attrs.get("feasible") for t in done)
    assert summary["survivors"] == {"memory": []} and summary["chosen"] == {}
    assert yaml.safe_load((spec.directory / "tuned.yaml").read_text())["knobs"] == {}


def test_a_setting_invalid_on_the_quality_model_fails_before_any_work(tmp_path):
    """A setting valid on the campaign's model whose mapping to the quality model breaks a check there (stage-2
    tiles 2 x 1 with a 2-latent-pixel overlap at 256 px wide: the overlap maps to 3 at the quality model's 384
    px, over half of its 4-pixel tiles) is a failed trial (invalid, "on the quality model") recorded by the
    driver before any model work, and the family samples on."""
    from vidtune.jobs import FamilyTrials

    spec = _spec(tmp_path, "model=tiny", "request.width=256", "quality_model.model=ltx2-mini", "name=qmx",
                 "quality_model.height=256", "quality_model.width=384", "families=[tiling]", "budget.trials_per_family=2")
    campaign = Campaign(spec, log=lambda line: None)
    studies = campaign._studies()
    bad = {"tiling.stage2_tiles.use": True, "tiling.stage2_tiles.rows": 2, "tiling.stage2_tiles.cols": 1,
           "tiling.stage2_tiles.overlap": 2, "tiling.vae_tiles.use": False}
    studies["tiling"].enqueue_trial(bad)
    job = FamilyTrials(campaign, studies).next_job()
    assert job is not None and job.setting != {"tiling.stage2_tiles": {"rows": 2, "cols": 1, "overlap": 2}}
    failed = _records(spec.directory / "trials.jsonl")
    assert [(r["status"], r["reason"], r["knobs"]) for r in failed] == [
        ("fail", "invalid", {"tiling.stage2_tiles": {"rows": 2, "cols": 1, "overlap": 2}})]
    assert "on the quality model" in failed[0]["message"] and "half a tile" in failed[0]["message"]


@pytest.mark.parametrize("override,needle", [
    ("families=[caching,speed]", "families must be a non-empty list from"),
    ("budget.trials_per_family=0", "budget.trials_per_family must be an integer >= 1"),
    ("budget.minutes=0", "budget.minutes must be null or a number of minutes > 0"),
    ("budget.minutes=soon", "budget.minutes must be a number or null, got 'soon'"),
    ("budget.run_minutes=-1", "budget.run_minutes must be null or a number of minutes > 0"),
    ("gate.psnr_db=high", "gate.psnr_db must be a number or null, got 'high'"),
    ("gate.flip=abc", "gate.flip must be a number or null, got 'abc'"),
    ("+gate.lpips=0.1", "gate.lpips is not a config field"),
    ("+tiers.Loose.flip=0.1", "a tier name must be lower-case"),
    ("+tiers.loose.nope=1", "tiers.loose.nope is not a gate field"),
    ("+tiers.loose.flip=null", "tiers.loose gates nothing"),
    ("eval.flip_frames=-1", "eval.flip_frames must be an integer >= 0"),
    ("storage=ftp://nowhere", "storage must be null (a journal file) or an RDB URL"),
    ("integrator.final_repeats=2", "integrator.final_repeats=2 cannot show a speed-up at integrator.max_p_value=0.05"),
    ("integrator.max_p_value=0", "integrator.max_p_value must be a number in (0, 1]"),
])
def test_bad_campaign_config(tmp_path, capsys, override, needle):
    assert main(["campaign", f"results_dir={tmp_path}", override]) == 2
    assert needle in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _write(tmp_path: Path, **changes) -> Path:
    doc = {"vidtune_tuned_config": 1, "knobs": {"caching.first_block": {"threshold": 0.1}}, "model": {"preset": "tiny"},
           "environment": {"device": "NVIDIA H200"}}
    doc.update(changes)
    p = tmp_path / "tuned.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_tuned_config_validation(tmp_path):
    from vidtune.model import ModelSource

    tiny = ModelSource(preset="tiny")
    with pytest.raises(TunedConfigError, match="unknown technique 'caching.nope'"):
        load_tuned_config(_write(tmp_path, knobs={"caching.nope": {"x": 1}}), tiny)
    with pytest.raises(TunedConfigError, match=r"caching.first_block.threshold must be a float in \[0.0, 1.0\]"):
        load_tuned_config(_write(tmp_path, knobs={"caching.first_block": {"threshold": 7}}), tiny)
    with pytest.raises(TunedConfigError, match="tuned for another model"):
        load_tuned_config(_write(tmp_path, model={"preset": "ltx2-19b"}), tiny)
    with pytest.raises(TunedConfigError, match="not a vidtune tuned config"):
        load_tuned_config(_write(tmp_path, vidtune_tuned_config=99), tiny)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doc = load_tuned_config(_write(tmp_path), tiny, device_name="cpu (x86_64)")
    assert any("measured on NVIDIA H200" in str(w.message) for w in caught)
    assert doc["knobs"]["caching.first_block"]["threshold"] == 0.1


class _Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.rows = 0
        self.images: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        self.rows += tag == "tr"
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag == "script":
            self._in_script = True
            self.scripts.append(a.get("src") or "")

    def handle_endtag(self, tag):
        self._in_script = self._in_script and tag != "script"


def test_report_is_self_contained_and_complete(finished_campaign):
    tmp_path, spec, summary, _ = finished_campaign
    report = spec.directory / "report.html"
    assert summary["report"] == str(report)
    text = report.read_text()
    p = _Html()
    p.feed(text)
    assert {"trials", "signoff", "measured", "tuned-knobs", "overhead", "found", "request", "gate", "noise-floor"} <= p.ids
    # the first screen says what was found (per tier, the speed-up, its spread, the quality's model, the setting in
    # words), before the raw config; the request and the gate as tables, not JSON
    assert text.index("<h2>Found</h2>") < text.index("<h2>Tuned config</h2>") and "Quality on " in text
    if summary["chosen"]:
        assert f"<b>x{summary['final']['speedup']:.2f}</b>" in text and "repeats" in text
        assert "nothing-found" not in p.ids
        # the verdict over the default grid (2 seeds x 2 prompts): the worst over its clips beside the campaign's
        assert summary["verdict"]["clips"] == 4 and "worst over 4 clips (seeds, prompts)" in text
    assert "<th>height</th><td>128</td>" in text
    assert p.rows >= 1 + 6  # header + every trial (and integrator rows)
    assert all(src == "" for src in p.scripts), "no external scripts: plotly.js is embedded"
    assert "http://" not in "".join(p.scripts) and "Plotly.newPlot" in text
    # frames 0, middle, last and the worst by PSNR (when another): baseline, tuned, difference each
    assert len(p.images) in (9, 12) and all(src.startswith("data:image/png;base64,") for src in p.images)
    assert "the worst frame" in text and "temporal PSNR" in text
    # the sign-off material: both videos embedded, in step; per-stage bars; failures listed (or said to be none)
    assert {"players", "failed"} <= p.ids and text.count("data:video/mp4;base64,") == 2 and "vt-sync" in text
    assert "latency per stage" in text
    # peak memory per trial and per stage it ran, next to its latency (gate.peak_memory_gb reads the first)
    peaks = next(r["stats"]["peak_memory_bytes"] for r in _records(spec.directory / "trials.jsonl")
                 if r.get("status") == "ok" and r["family"] != "integrator")
    assert "<th>peak per stage GiB</th>" in text
    assert ", ".join(f"{k} {v / 2**30:.2f}" for k, v in peaks.items()) in text
    assert "family: caching" in text and "family: tiling" in text
    feasible = [r for r in _records(spec.directory / "trials.jsonl")
                if r.get("status") == "ok" and r.get("quality") and r["quality"]["psnr_db"] >= 30.0]
    assert ("feasible Pareto front" in text) == bool(feasible)
    assert "gate 30.0 dB" in text
    # the significance of the exported speed-up is shown whenever a combination was tested
    assert ("Mann-Whitney p =" in text) == (summary["final"].get("p_value") is not None and bool(summary["chosen"]))


def test_a_report_of_a_campaign_that_found_nothing_says_so_and_shows_no_speed_up(finished_campaign, tmp_path):
    """A campaign whose export is the baseline: its report leads with "Nothing found" and shows the baseline's
    re-measure against itself as noise, never as a speed-up in bold (a newcomer read x1.225 as a result)."""
    _, spec, _, _ = finished_campaign
    copy = tmp_path / "results" / spec.name
    shutil.copytree(spec.directory, copy, ignore=shutil.ignore_patterns("*.lock"))
    summary = json.loads((copy / "campaign.json").read_text())
    summary["chosen"], summary["tiers"] = {}, None
    summary["final"] = {**summary["final"], "speedup": 1.225}
    (copy / "campaign.json").write_text(json.dumps(summary))
    tuned = yaml.safe_load((copy / "tuned.yaml").read_text())
    tuned["knobs"], tuned["measured"]["speedup"] = {}, 1.225
    (copy / "tuned.yaml").write_text(yaml.safe_dump(tuned))
    assert main(["report", spec.name, "--results-dir", str(tmp_path / "results")]) == 0
    text = (copy / "report.html").read_text()
    p = _Html()
    p.feed(text)
    assert "nothing-found" in p.ids and "<b>x1.2" not in text
    assert "no speed-up: the tuned config is the baseline" in text and "nothing found:" in text


def test_a_torn_last_record_still_reports_and_a_resume_appends_after_it(finished_campaign, tmp_path, capsys):
    """A crash mid-append leaves half a line in trials.jsonl: `vidtune report` renders (before: JSONDecodeError)
    and the next record lands on a line of its own (before: glued to the torn one, both lost)."""
    from vidtune.search.records import RecordLog

    _, spec, _, _ = finished_campaign
    copy = tmp_path / "results" / spec.name
    shutil.copytree(spec.directory, copy, ignore=shutil.ignore_patterns("*.lock"))
    log = copy / "trials.jsonl"
    whole = len(_records(log))
    with open(log, "ab") as f:
        f.write(b'{"family": "caching", "trial": 99, "status": "o')
    assert main(["report", spec.name, "--results-dir", str(tmp_path / "results")]) == 0
    assert (copy / "report.html").stat().st_size > 0
    RecordLog(log).append({"family": "caching", "trial": 100, "status": "fail", "reason": "error"})
    assert [r.get("trial") for r in _records(log)][whole:] == [100] and list(copy.glob("trials.jsonl.torn-*"))


def test_a_campaign_goes_on_from_its_packed_records_on_a_new_machine(finished_campaign, tmp_path):
    """A GPU machine lost between calls takes the campaign's folder with it; benchmarks/device_campaign.sh packs
    it after each call without tensors and videos, and with RESUME_ARCHIVE unpacks it on the next machine. From
    that archive the campaign goes on: the baseline computed again (its tensors were left out; the same key), no
    family trial, combination, verdict or final bench measured again, the tuned configs exported again. The
    script refuses an archive that holds another campaign, before any work."""
    _, spec, summary, _ = finished_campaign
    archive, results = tmp_path / "campaign.tar.gz", tmp_path / "results"
    subprocess.run(["tar", "czf", str(archive), "-C", str(spec.directory.parent), "--exclude=*.safetensors",
                    "--exclude=*.mp4", "--exclude=report.html", "--exclude=*.lock", spec.name], check=True)
    env = {**os.environ, "SKIP_INSTALL": "1", "RESUME_ARCHIVE": str(archive), "CAMPAIGN_RESULTS": str(results),
           "OUT": str(tmp_path / "out")}
    wrong = subprocess.run(["bash", "benchmarks/device_campaign.sh", "run", "-"], env={**env, "CAMPAIGN_NAME": "other"},
                           cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "holds no campaign named other" in wrong.stderr
    subprocess.run(["tar", "xzf", str(archive), "-C", str(results)], check=True)  # (what the script did)
    assert not list((results / spec.name).rglob("*.safetensors"))
    before = _records(results / spec.name / "trials.jsonl")
    again = _spec(tmp_path, *E2E, fast=E2E_FAST)
    lines: list[str] = []
    out = _pooled(again, log=lines.append).run()
    assert any(line.startswith("baseline computed") for line in lines), lines
    after = _records(results / spec.name / "trials.jsonl")
    assert after[:len(before)] == before and not after[len(before):], after[len(before):]  # nothing measured again
    assert out["chosen"] == summary["chosen"]
    for key in ("speedup", "baseline_total_ms", "tuned_total_ms"):  # (the recorded final bench, not a new one)
        assert out["final"][key] == summary["final"][key], key
    assert (results / spec.name / "tuned.yaml").is_file()


def test_a_seed_config_is_queued_first_in_the_families_it_touches(tmp_path):
    """seed_configs: a tuned config written for another request is mapped to the campaign's by frame size and
    queued first in each family it touches, its part only, as the family's own sampling parameters (the first
    trial asked is that setting); a resumed run does not queue it again; a part the family cannot sample here
    is said and not queued; a file that is no tuned config, or a rejected one, is refused naming the field."""
    from vidtune.cli import CliError
    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import ask_effective

    hand = {"vidtune_tuned_config": 1, "model": {"preset": "tiny"}, "request": GenerationRequest().to_dict(),
            "knobs": {"tiling.stage2_tiles": {"rows": 2, "cols": 2, "overlap": 1},
                      "tiling.vae_tiles": {"spatial_px": 192, "spatial_overlap_px": 32, "temporal_frames": 16,
                                           "temporal_overlap_frames": 8},
                      "caching.step_skip": {"every": 2, "stage": "both"},
                      # (fp8 with compile is no setting the CPU's kernel_choice sampling offers)
                      "kernel_choice.fp8_linear": {"layers": "all"}, "kernel_choice.compile": {"mode": "default"}}}
    seed = tmp_path / "hand.yaml"
    seed.write_text(yaml.safe_dump(hand))
    args = ["model=tiny", "request.width=768", "name=sd", "families=[tiling,kernel_choice,caching]", f"seed_configs=[{seed}]"]
    spec = _spec(tmp_path, *args)
    # the stage-2 overlap (latent pixels) follows the frame, 384 -> 768 px; VAE tiles stay in pixels
    assert spec.seeds[0]["knobs"]["tiling.stage2_tiles"]["overlap"] == 2
    assert spec.seeds[0]["knobs"]["tiling.vae_tiles"]["spatial_px"] == 192
    assert spec.seeds[0]["notes"] == ["tiling.stage2_tiles.overlap: 1 -> 2 (size 384 -> 768)"]
    lines: list[str] = []
    studies = Campaign(spec, log=lines.append)._studies()
    req = spec.worker.request
    for family in ("tiling", "caching"):
        queued = [t for t in studies[family].trials if t.state == optuna.trial.TrialState.WAITING]
        assert [t.user_attrs.get("seeded_from") for t in queued if "probe" not in t.user_attrs] == [str(seed)]
        assert "seeded_from" in queued[0].user_attrs  # (first; the family's probes after it)
        trial, setting, _ = ask_effective(studies[family], family, req)
        want = {n: v for n, v in spec.seeds[0]["knobs"].items() if n.startswith(family + ".")}
        assert {n: get(n).validate(v) for n, v in setting.items()} == want
    assert not studies["kernel_choice"].trials
    assert any(line.startswith("[kernel_choice] seed") and "not queued" in line for line in lines)
    # resumed (the asked trials were interrupted: re-queued by the driver, the seeds not queued again)
    again = Campaign(_spec(tmp_path, *args), log=lines.append)._studies()
    for family in ("tiling", "caching"):
        waiting = [t for t in again[family].trials if t.state == optuna.trial.TrialState.WAITING
                   and "probe" not in t.user_attrs]  # (the probes queued when the study was new still wait)
        assert len(waiting) == 1 and "requeued_from" in waiting[0].user_attrs  # (the interrupted one, its origin kept)
        assert waiting[0].user_attrs["seeded_from"] == str(seed)
    bad = tmp_path / "bad.yaml"
    bad.write_text("knobs: {}\n")
    with pytest.raises(CliError, match="seed_configs: .*not a vidtune tuned config"):
        _spec(tmp_path, "name=x", f"seed_configs=[{bad}]")
    seed.write_text(yaml.safe_dump({**hand, "signoff": {"by": "a", "verdict": "reject"}}))
    with pytest.raises(CliError, match="seed_configs: .*rejected|seed_configs: .*reject"):
        _spec(tmp_path, "name=x", f"seed_configs=[{seed}]")


def test_a_second_campaign_starts_from_the_first_ones_best(finished_campaign):
    """warm_start: a campaign of the same model and device on another request queues the earlier campaign's
    fastest feasible trials of each family first (its first trials are those findings, not random ones);
    a name that is no campaign, or one of another model, is refused naming the field."""
    from vidtune.cli import CliError
    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import ask_effective

    tmp_path, spec, summary, _ = finished_campaign
    results = f"results_dir={tmp_path / 'results'}"
    second = Settings(load_config([results, "name=e2e-seed5", "request.seed=5", "families=[caching,tiling]",
                                   "warm_start=[e2e]"])).campaign_spec()
    lines: list[str] = []
    studies = Campaign(second, log=lines.append)._studies()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(spec.directory / "optuna.journal")))
    req = second.worker.request
    queued_any = any(t.state == optuna.trial.TrialState.WAITING and "warm_start_from" in t.user_attrs
                     for s in studies.values() for t in s.trials)
    for family in ("caching", "tiling"):
        first = optuna.load_study(study_name=f"e2e:{family}", storage=storage)
        best = sorted((t for t in first.trials if t.state == optuna.trial.TrialState.COMPLETE
                       and t.user_attrs.get("feasible") and t.user_attrs["paired"]["faster"]), key=lambda t: t.values[0])[:2]
        queued = [t for t in studies[family].trials if t.state == optuna.trial.TrialState.WAITING]
        probes = [t for t in queued if "probe" in t.user_attrs]  # (the family's probes come after them)
        queued = queued[:len(queued) - len(probes)]
        assert [t.system_attrs["fixed_params"] for t in queued] == [t.params for t in best]
        assert [t.user_attrs["warm_start_from"] for t in queued] == [f"e2e:{family}#{t.number}" for t in best]
        if best:  # the next asked trial is the earlier campaign's best
            trial, _, _ = ask_effective(studies[family], family, req)
            assert trial.params == best[0].params
    assert any("warm start: e2e:" in line for line in lines) == queued_any  # (asked above: no longer waiting)
    with pytest.raises(CliError, match="warm_start: 'nope' is not an earlier campaign"):
        Settings(load_config([results, "name=x", "warm_start=[nope]"])).campaign_spec()
    with pytest.raises(CliError, match="warm_start: campaign 'e2e' ran another model"):
        Settings(load_config([results, "name=x", "model=tiny", "warm_start=[e2e]"])).campaign_spec()


def test_signoff_recorded_and_shown(finished_campaign, capsys):
    tmp_path, spec, _, _ = finished_campaign
    args = ["--results-dir", str(tmp_path / "results")]
    assert main(["signoff", "e2e", *args, "--by", "Ada", "--verdict", "approve", "--note", "checked frames"]) == 0
    doc = yaml.safe_load((spec.directory / "tuned.yaml").read_text())
    assert doc["signoff"]["by"] == "Ada" and doc["signoff"]["verdict"] == "approve" and doc["signoff"]["at"]
    assert "approve by Ada" in (spec.directory / "report.html").read_text()
    assert main(["signoff", "nope", *args, "--by", "Ada", "--verdict", "approve"]) == 2
    assert "campaign 'nope' not found" in capsys.readouterr().err


def test_agents_ask_and_tell(finished_campaign, capsys, tmp_path):
    root, spec, _, _ = finished_campaign
    args = ["--results-dir", str(root / "results")]
    assert main(["ask", "e2e", *args, "--family", "caching"]) == 0
    asked = json.loads(capsys.readouterr().out)
    assert asked["family"] == "caching" and isinstance(asked["knobs"], dict)
    check_composition(asked["knobs"])
    result = tmp_path / "result.json"
    good = {"status": "ok", "total_ms": 1.0, "knobs": asked["knobs"],
            "quality": {"psnr_db": 45.0, "ssim": 0.999, "audio_snr_db": 30.0}}
    # bad results are refused by field and record nothing (before: NaN recorded ok in trials.jsonl and FAIL
    # in the study; strings crashed and left the trial RUNNING); the trial stays the agent's to tell
    for bad, field in (({**good, "total_ms": float("nan")}, "total_ms"), ({**good, "total_ms": "fast"}, "total_ms"),
                       ({**good, "quality": {**good["quality"], "ssim": "0.9"}}, "quality.ssim"),
                       ({**good, "status": "done"}, "status"), ([1, 2], "JSON object")):
        result.write_text(json.dumps(bad))
        assert main(["tell", "e2e", *args, "--trial", str(asked["trial"]), "--result", str(result)]) == 2
        assert field in capsys.readouterr().err
    jsonl = spec.directory / "trials.jsonl"
    assert not any(json.loads(line).get("trial") == asked["trial"] and json.loads(line).get("family") == "caching"
                   for line in jsonl.read_text().splitlines()) if jsonl.is_file() else True
    result.write_text(json.dumps(good))
    assert main(["tell", "e2e", *args, "--trial", str(asked["trial"]), "--result", str(result)]) == 0
    told = json.loads(capsys.readouterr().out)
    assert told == {"family": "caching", "trial": asked["trial"], "state": "COMPLETE"}
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(spec.directory / "optuna.journal")))
    t = optuna.load_study(study_name="e2e:caching", storage=storage).trials[asked["trial"]]
    assert t.values == [1.0, 45.0] and t.user_attrs["feasible"] is True
    assert t.constraints == {str(i): c for i, c in enumerate(spec.gate.constraints(
        {"psnr_db": 45.0, "ssim": 0.999, "audio_snr_db": 30.0}))} and max(t.constraints.values()) <= 0
    assert main(["tell", "e2e", *args, "--trial", str(asked["trial"]), "--result", str(result)]) == 2
    assert "no running trial" in capsys.readouterr().err
    assert main(["ask", "e2e", *args, "--family", "parallelism"]) == 2
    assert "--family must be one of the campaign's families" in capsys.readouterr().err


@pytest.mark.skipif(not any(Path(p).exists() for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser")),
                    reason="headless Chromium not installed")
def test_report_renders_in_headless_chromium(finished_campaign, tmp_path):
    _, spec, _, _ = finished_campaign
    exe = next(p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists())
    shot = tmp_path / "report.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'ud'}",
                    "--window-size=1280,2400", f"--screenshot={shot}", (spec.directory / "report.html").as_uri()],
                   capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000  # a rendered page, not a blank one
    from PIL import Image

    img = Image.open(shot).convert("L")
    extrema = img.getextrema()
    assert extrema[0] < 100 < extrema[1]  # text and plots drawn on the page
    # the DOM after its scripts ran: the two players and the plots plotly drew (its SVG layers)
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'ud2'}", "--virtual-time-budget=5000", "--dump-dom",
                          (spec.directory / "report.html").as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<video") == 2 and dom.count('class="vt-sync"') == 2
    assert dom.count("main-svg") >= 4  # the families', the integrator's, per-frame and per-stage plots, drawn


def test_integrator_combinations_reject_conflicts():
    from vidtune.integrator.combine import combinations

    survivors = {
        "caching": [{"knobs": {"caching.first_block": {"threshold": 0.1}}}, {"knobs": {"caching.teacache": {"threshold": 0.2}}}],
        "kernel_choice": [{"knobs": {"kernel_choice.compile": {"mode": "default"}}},
                          {"knobs": {"kernel_choice.cuda_graphs": {"enabled": True}}}],
        "tiling": [],
    }
    combos = combinations(survivors)
    # (none + 2) x (none + 2) - the empty one = 8; compile and cuda_graphs never together (same family: at most one)
    assert len(combos) == 8
    for c in combos:
        check_composition(c)
        assert not ("caching.first_block" in c and "caching.teacache" in c)


_SURVIVORS = {
    "caching": [{"knobs": {"caching.first_block": {"threshold": 0.1}}}, {"knobs": {"caching.teacache": {"threshold": 0.2}}},
                {"knobs": {"caching.step_skip": {"every": 2}}}],
    "kernel_choice": [{"knobs": {"kernel_choice.compile": {"mode": "default"}}},
                      {"knobs": {"kernel_choice.cuda_graphs": {"enabled": True}}}],
    "tiling": [{"knobs": {"tiling.vae_tiles": {"spatial_px": 256}}}],
}


def _ok(ms: float, psnr: float = 40.0) -> dict:
    return {"status": "ok", "total_ms": ms, "quality": {"psnr_db": psnr, "ssim": 0.99, "audio_snr_db": 30.0}}


@pytest.mark.parametrize("max_exhaustive", [64, 4])
def test_combination_search_never_repeats_and_resumes(max_exhaustive):
    """Exhaustive (23 combinations) or an Optuna search (8 of them): never the empty combination, never one
    twice; a second search told the first one's results (a resume) proposes only what had not finished."""
    from vidtune.integrator.combine import CombinationSearch, choose, combo_key
    from vidtune.search.campaign import Gate

    gate = Gate(psnr_db=35.0, ssim=0.95, audio_snr_db=10.0)

    def search():
        return CombinationSearch(_SURVIVORS, gate, seed=3, max_exhaustive=max_exhaustive, trials=8)

    first = search()
    assert first.exhaustive == (max_exhaustive == 64) and first.total == (23 if first.exhaustive else 8)
    proposed = []
    while (setting := first.propose()) is not None:
        assert setting and combo_key(setting) not in {combo_key(p) for p in proposed}
        check_composition(setting)
        proposed.append(setting)
        if len(proposed) == 3:
            break  # (killed here: three in flight, two of them finished)
    for i, setting in enumerate(proposed[:2]):
        first.tell(setting, _ok(100.0 - i))
    resumed = search()
    for setting, res in first.results.values():
        resumed.tell(setting, res)
    rest = []
    while (setting := resumed.propose()) is not None:
        rest.append(setting)
        resumed.tell(setting, _ok(200.0, psnr=30.0 if len(rest) % 2 else 40.0))
    keys = [combo_key(s) for s in proposed[:2] + rest]
    assert len(keys) == len(set(keys)) == resumed.total and combo_key(proposed[2]) in set(keys)
    assert choose(resumed.evaluated()) == proposed[1]  # the fastest that passes the gate (99 ms)


@pytest.mark.parametrize("max_exhaustive", [64, 4])
def test_combination_search_reuses_single_survivors_and_tries_the_predicted_best_first(max_exhaustive):
    """A one-family combination is that family's trial (seed_measured): never proposed, and in a budgeted search
    it uses none of the budget. The first proposals are the combinations whose parts' measured speed-ups
    multiply to the lowest latency (the exhaustive queue keeps one compiled configuration contiguous)."""
    from vidtune.integrator.combine import CombinationSearch, combo_key
    from vidtune.search.campaign import Gate

    survivors = {f: [{**s, "total_ms": ms} for s, ms in zip(front, times)] for (f, front), times in
                 zip(sorted(_SURVIVORS.items()), ([90.0, 95.0, 99.0], [60.0, 97.0], [80.0]))}
    search = CombinationSearch(survivors, Gate(30.0, 0.0, -100.0), seed=3, max_exhaustive=max_exhaustive, trials=4,
                               baseline_ms=100.0)
    singles = [s["knobs"] for front in survivors.values() for s in front]
    for knobs in singles:
        search.seed_measured(knobs, _ok(100.0))
    assert search.total == (23 if search.exhaustive else 4 + len(singles))
    proposed = []
    while (setting := search.propose()) is not None:
        proposed.append(setting)
        search.tell(setting, _ok(50.0))
    keys = [combo_key(s) for s in proposed]
    assert len(keys) == len(set(keys)) and not set(keys) & {combo_key(k) for k in singles}
    best = {**survivors["caching"][0]["knobs"], **survivors["kernel_choice"][0]["knobs"], **survivors["tiling"][0]["knobs"]}
    assert search.predicted_ms(best) == pytest.approx(100.0 * 0.9 * 0.6 * 0.8)
    from vidtune.techniques.setting import Setting

    assert proposed[0] == Setting(best)  # (0.432 of the baseline; random order would put it first 1 time in 19)
    assert len(proposed) == (23 - len(singles) if search.exhaustive else 4)


def test_dead_actor_is_recorded_and_replaced(tmp_path, monkeypatch):
    """Three faults in one campaign, each recorded, and the campaign goes on: a worker process that dies in a trial
    (replaced); a trial that runs out of memory and leaves it held in its process (as a CUDA graph's pool outliving
    its failed capture did on an H100, after which 48 evaluations of that process failed as OOM): recorded as oom,
    its actor replaced; the final bench of the chosen setting running out of memory: recorded, its actor replaced,
    the setting rejected with the reason and the baseline exported."""
    import ray

    if ray.is_initialized():
        ray.shutdown()  # the actors must start with the fault-injection variable in their environment
    monkeypatch.setenv("VIDTUNE_FAULT_INJECT", ",".join(f"{kind}:{tmp_path / kind}" for kind in (
        "die-once", "oom-stuck-once", "bench-oom-once")))
    spec = _spec(tmp_path, "model=tiny", *SMALL, "name=die", "families=[caching]", "budget.trials_per_family=4",
                 "gate.psnr_db=0", "gate.ssim=0", "gate.audio_snr_db=-100")
    lines: list[str] = []
    summary = Campaign(spec, log=lines.append).run()
    records = [r for r in _records(spec.directory / "trials.jsonl") if r["family"] == "caching"]
    assert all((tmp_path / kind).exists() for kind in ("die-once", "oom-stuck-once", "bench-oom-once"))
    died = [r for r in records if r.get("reason") == "actor-died"]
    stuck = [r for r in records if r.get("reason") == "oom"]
    assert len(died) == 1 and len(stuck) == 1 and len(records) == 4
    assert "GiB stayed held after the failure" in stuck[0]["replace_worker"]
    assert any(line.startswith("actor replaced after a failed") for line in lines), lines
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 2  # the replacements went on, and measured for real
    assert all(r["total_ms"] > 0 and "psnr_db" in r["quality"] for r in ok)
    finals = [r for r in _records(spec.directory / "trials.jsonl") if r.get("phase") == "final"]
    assert [r["result"].get("reason") for r in finals] == ["oom", None]  # the setting's, then the baseline's
    assert summary["chosen"] == {} and "its final bench failed (oom" in summary["rejected"]["reason"]
    final = summary["final"]
    assert (spec.directory / "tuned.yaml").is_file()
    assert final["speedup"] == pytest.approx(statistics.median(final["baseline_total_ms"]) /
                                             statistics.median(final["tuned_total_ms"]))
    # the OOM's record says what its process held before it (clean), so a later campaign of this machine does
    # not draw that setting again (search/knowledge.py)
    assert stuck[0]["memory"] == {"cap_gib": None, "held_before_gib": 0.0}
    later = Campaign(_spec(tmp_path, "model=tiny", *SMALL, "name=later", "families=[caching]"), log=lambda *_: None)
    from vidtune.techniques.setting import Setting

    assert "ran out of memory in die:caching#" in (later.known_loser(Setting.of(stuck[0]["knobs"])) or "")


def test_bench_remeasures_a_tuned_config_interleaved(finished_campaign, capsys):
    root, spec, _, _ = finished_campaign
    tuned = spec.directory / "tuned.yaml"
    assert main(["bench", f"results_dir={root / 'results'}", "name=e2e", *SMALL, "eval.warmup=0", "--config", str(tuned),
                 "--repeats", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["baseline_total_ms"]) == len(out["tuned_total_ms"]) == 2
    assert out["speedup"] == pytest.approx(statistics.median(out["baseline_total_ms"]) /
                                           statistics.median(out["tuned_total_ms"]), abs=1e-4)  # printed to 4 places
    doc = yaml.safe_load(tuned.read_text())
    if not doc["knobs"] or all(get(n).is_off(v) for n, v in doc["knobs"].items()):
        assert out["quality"]["psnr_db"] >= 99  # the baseline against itself: the same frames
    assert "alternated" in out["method"] and out["order"].startswith("A B, B A")
    # the per-stage split of both, and the ratio per stage
    assert set(out["stages"]) == {"stage1", "upsample", "stage2", "decode_video", "decode_audio"}
    for v in out["stages"].values():
        assert v["baseline_ms"] > 0 and v["tuned_ms"] > 0 and v["speedup"] == pytest.approx(v["baseline_ms"] / v["tuned_ms"])
    assert main(["bench", f"results_dir={root / 'results'}", "name=e2e"]) == 2  # --config is required


def _ask_and_tell(campaign: Campaign, family: str, n: int) -> None:
    """``n`` trials of ``family`` asked as the campaign asks them and told made-up results (no model runs)."""
    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import ask_effective

    study = campaign._studies()[family]  # as a (re)started campaign opens it
    req = campaign.spec.worker.request
    for i in range(n):
        trial, setting, _ = ask_effective(study, family, req)
        assert trial is not None
        study.tell(trial, [100.0 + i, 40.0])


def test_a_resumed_study_proposes_nothing_measured_before(tmp_path):
    """Each restart of a campaign (a resume after a kill) opens its studies again: the sampler must not start
    its random stream over (it re-proposed trial 0's parameters), and a sample an earlier trial measured is
    skipped as a duplicate, not measured again."""
    spec = _spec(tmp_path, "name=rs", "families=[caching]")
    for _ in range(3):  # a start and two resumes, 3 trials each (the first 4 are TPE's random ones)
        _ask_and_tell(Campaign(spec, log=lambda *_: None), "caching", 3)
    study = Campaign(spec, log=lambda *_: None)._studies()["caching"]
    measured = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    keys = [json.dumps(t.params, sort_keys=True) for t in measured]
    assert len(measured) == 9 and len(set(keys)) == 9
    assert not [t for t in study.trials if t.user_attrs.get("reason") == "duplicate"]  # (float knobs: none had to be)
    # a sample that repeats a measured trial (here: queued by hand) is skipped, with the trial it repeats
    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import ask_effective

    study.enqueue_trial(measured[0].params)
    trial, setting, skipped = ask_effective(study, "caching", spec.worker.request)
    assert skipped == 1 and json.dumps(trial.params, sort_keys=True) not in keys
    dup = [t for t in study.trials if t.user_attrs.get("reason") == "duplicate"]
    assert [t.user_attrs["duplicate_of"] for t in dup] == [measured[0].number]
    assert dup[0].state == optuna.trial.TrialState.PRUNED


def test_requeue_keeps_sampled_params_and_skips_unsampled_trials(tmp_path):
    """A trial killed before sampling is not re-queued; one killed mid-sampling keeps what was sampled."""
    spec = _spec(tmp_path, "name=rq", "families=[caching]")
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="rq:caching", storage=storage, directions=["minimize", "maximize"])
    empty = study.ask()
    partial = study.ask()
    partial.suggest_categorical("caching.first_block.use", [False, True])
    lines: list[str] = []
    Campaign(spec, log=lines.append)._requeue_interrupted(study, "caching", storage)
    trials = study.get_trials(deepcopy=False)
    assert trials[empty.number].state == optuna.trial.TrialState.FAIL
    assert trials[partial.number].state == optuna.trial.TrialState.FAIL
    queued = [t for t in trials if t.user_attrs.get("requeued_from") is not None]
    assert [t.user_attrs["requeued_from"] for t in queued] == [partial.number]
    assert any("before its setting was sampled" in line for line in lines)


def test_a_trial_is_leased_as_it_is_asked_so_another_driver_starting_meanwhile_leaves_it(tmp_path):
    """Two drivers on one storage: B starts (and FAILs the RUNNING trials of no live lease as interrupted) while A
    samples a trial it has just asked. The trial is leased at the ask (FamilyTrials._lease through ask_effective's
    on_ask), so B leaves it to A and A's sampling goes on. (Leased only after the sampling and the checks, the
    fresh-clone CI's two-process PostgreSQL test failed: UpdateFinishedTrialError in A's sampling.)"""
    from vidtune.jobs import FamilyTrials
    from vidtune.search.sampling import ask_effective

    spec_a = _spec(tmp_path / "a", "name=la", "families=[caching]")
    spec_b = _spec(tmp_path / "b", "name=lb", "families=[caching]")
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="l:caching", storage=storage, directions=["minimize", "maximize"])
    a, b = Campaign(spec_a, log=print), Campaign(spec_b, log=print)
    assert a.owner != b.owner
    lease = FamilyTrials(a, {"caching": study})._lease

    def asked(trial):
        lease(trial)
        b._requeue_interrupted(study, "caching", storage)  # B starts right now

    trial, setting, _ = ask_effective(study, "caching", spec_a.worker.request, on_ask=asked)
    assert setting and storage.get_trial(trial._trial_id).state == optuna.trial.TrialState.RUNNING
    assert trial.user_attrs["lease_owner"] == a.owner


def test_a_combination_slower_than_the_baseline_is_not_exported(finished_campaign, tmp_path):
    """The interleaved re-measurement decides: a gated combination measured slower than the baseline
    gives way to the baseline (re-measured), and the export records it as the rejected candidate."""
    import dataclasses

    from vidtune.integrator.combine import keep_if_faster
    from vidtune.integrator.tuned import export_tuned_config

    _, spec, summary, _ = finished_campaign
    final = summary["final"]
    slow = {**final, "speedup": 0.97, "baseline_total_ms": [100.0, 101.0], "tuned_total_ms": [104.0, 103.0]}
    knobs = {"caching.step_skip": {"every": 2}}
    asked: list[dict] = []

    def bench(k):
        asked.append(k)
        return {**final, "speedup": 1.0}

    lines: list[str] = []
    chosen, out, rejected = keep_if_faster(knobs, slow, bench, lines.append)
    assert chosen == {} and asked == [{}] and out["speedup"] == 1.0
    assert rejected["knobs"] == knobs and rejected["speedup"] == 0.97 and "slower than the baseline" in lines[0]
    # every tuned run faster than every baseline run: p = 1 / C(6, 3) = 0.05, exported
    fast = {**final, "speedup": 1.2, "baseline_total_ms": [100.0, 101.0, 102.0], "tuned_total_ms": [83.0, 84.0, 85.0]}
    kept, out_fast, none = keep_if_faster(knobs, fast, bench, lines.append)
    assert (kept, none, asked) == (knobs, None, [{}]) and out_fast["p_value"] == pytest.approx(0.05)
    assert keep_if_faster({}, slow, bench, lines.append) == ({}, slow, None)  # the baseline itself stays
    # the H200 campaign's final measurement (results/campaigns/h200-ltx2-19b): a combination that changed
    # nothing measured x1.096 inside the baseline's own spread; the test rejects it (p = 0.2)
    noisy = {**final, "speedup": 1.096, "baseline_total_ms": [3156.8, 3533.6, 3672.5],
             "tuned_total_ms": [3223.9, 3043.8, 3239.6]}
    chosen2, _, rejected2 = keep_if_faster(knobs, noisy, bench, lines.append)
    assert chosen2 == {} and rejected2["p_value"] == pytest.approx(0.2) and "not significantly faster" in lines[-1]
    assert keep_if_faster(knobs, noisy, bench, lines.append, max_p=1.0)[0] == knobs  # median ratio alone
    # the export carries the rejected candidate next to the (baseline) knobs, and still loads
    other = dataclasses.replace(spec, results_dir=str(tmp_path))
    shutil.copytree(spec.directory, other.directory)  # a copy: the shared campaign stays as it was
    baseline = json.loads((spec.directory / "baseline" / "meta.json").read_text())
    path = export_tuned_config(other, chosen, out, baseline, rejected=rejected)
    assert path.parent == other.directory != spec.directory
    doc = yaml.safe_load(path.read_text())
    assert doc["rejected_candidate"]["knobs"] == knobs and doc["measured"]["speedup"] == 1.0
    settings = Settings(load_config([f"results_dir={tmp_path}", "name=e2e"]))
    assert load_tuned_config(path, settings.source)["knobs"] == doc["knobs"]
    from vidtune.integrator.report import build_report

    p = _Html()
    p.feed(build_report(other.directory).read_text())
    assert "rejected" in p.ids


def test_a_resumed_campaign_sampled_from_another_search_space_is_refused_before_any_work(tmp_path, capsys):
    """A study sampled when compile's mode could be "off" (before switches) cannot take the new choices
    (Optuna refuses a categorical to change inside a study): the campaign says so and stops before the
    baseline, instead of crashing at its first trial."""
    from vidtune.search.campaign import storage_for

    spec = _spec(tmp_path, "name=old", "families=[kernel_choice]")
    study = optuna.create_study(study_name="old:kernel_choice", storage=storage_for(spec),
                                directions=["minimize", "maximize"])
    trial = study.ask()
    trial.suggest_categorical("kernel_choice.compile.mode", ["off", "default", "max-autotune-no-cudagraphs"])
    study.tell(trial, [1.0, 1.0])
    assert main(["campaign", f"results_dir={tmp_path / 'results'}", "name=old", "families=[kernel_choice]"]) == 2
    err = capsys.readouterr().err
    assert "kernel_choice.compile.mode" in err and "Start a new campaign" in err
    assert not (spec.directory / "baseline").exists()


def test_report_frames_of_a_4k_video_are_shrunk_with_differences_kept():
    """A 4K frame is shown at 1/4 size (a full-size PNG is ~25 MB); a one-pixel difference survives the
    shrinking of the heat map (block maximum) and the full-size crop is centred on it."""
    import numpy as np

    from vidtune.integrator.report import CROP, frame_views

    rng = np.random.default_rng(0)
    b = rng.integers(0, 256, (2160, 3840, 3), dtype=np.uint8)
    t = b.copy()
    t[1500, 3001, 1] ^= 0x40  # one channel of one pixel off by 64
    v = frame_views(b, t)
    assert v["factor"] == 4 and v["baseline"].shape == (540, 960, 3) == v["diff"].shape
    assert v["diff"].max() == 64 and np.count_nonzero(v["diff"]) == 1 and v["diff"][375, 750, 1] == 64
    c = v["crop"]
    assert c["baseline"].shape == (CROP, CROP, 3) and c["diff"][1500 - c["y"], 3001 - c["x"], 1] == 64
    small = frame_views(b[:256, :384], t[:256, :384])  # the tiny preset's size: shown as it is
    assert small["factor"] == 1 and "crop" not in small and small["baseline"] is not None


def test_trials_of_one_compiled_configuration_share_an_actor_and_run_back_to_back():
    """Compile-aware scheduling: a compiled job goes to the actor that compiled that configuration last
    (else to one holding none), an uncompiled job to an actor without compiled graphs where there is one;
    the integrator's exhaustive queue puts combinations of one compiled configuration next to each other.
    The signature ignores the caching family (steps run, not code) and is None without a compile."""
    from vidtune.driver import pick_actor
    from vidtune.integrator.combine import CombinationSearch
    from vidtune.search.campaign import Gate
    from vidtune.techniques.setting import compile_signature

    comp = {"kernel_choice.compile": {"mode": "default"}}
    assert compile_signature({"caching.first_block": {"threshold": 0.1}}) is None
    assert compile_signature({**comp, "caching.first_block": {"threshold": 0.1}}) == compile_signature(comp)
    assert compile_signature({**comp, "tiling.vae_tiles": {"spatial_px": 256}}) != compile_signature(comp)

    a, b, c = object(), object(), object()
    compiled = {id(a): compile_signature(comp)}
    free = [a, b, c]
    assert pick_actor(free, compile_signature(comp), compiled) is a and free == [b, c]  # its graphs are warm
    free = [a, b, c]
    assert pick_actor(free, None, compiled) is c  # an uncompiled job leaves a's graphs alone
    other = compile_signature({"kernel_choice.vae_decode": {"compile": "default"}})
    free = [a, b]
    assert pick_actor(free, other, compiled) is b  # a new configuration: an actor that holds none
    compiled[id(b)] = other
    free = [a, b]
    assert pick_actor(free, None, compiled) is b and free == [a]  # all hold graphs: any free one

    search = CombinationSearch(_SURVIVORS, Gate(30.0, 0.0, -100.0), max_exhaustive=64)
    order = []
    while (s := search.propose()) is not None:
        order.append(compile_signature(s))
    groups = [sig for i, sig in enumerate(order) if i == 0 or sig != order[i - 1]]
    assert len(groups) == len(set(groups)) and groups[0] is None  # each configuration once, contiguous
    assert sum(sig is not None for sig in order) >= 2


def test_a_campaign_exports_one_tuned_config_per_quality_tier(tmp_path):
    """With tiers, the families search under "passes some tier" (one constraint), and each tier exports its own
    tuned config: a setting within that tier's gate, measured on its own, or the baseline; tuned.yaml is the
    strictest tier's and the report shows the ladder."""
    spec = _spec(tmp_path, "model=tiny", *SMALL, "name=tiers", "families=[caching]", "budget.trials_per_family=3",
                 "+tiers.exact.psnr_db_worst=100", "+tiers.any.psnr_db_worst=0")
    assert [t for t, _ in spec.tiers] == ["exact", "any"]
    summary = _pooled(spec, log=lambda line: None).run()
    ok = [r for r in _records(spec.directory / "trials.jsonl") if r["family"] == "caching" and r["status"] == "ok"]
    assert ok and all(len(r["constraints"]) == 1 for r in ok)  # AnyTier: the smallest over the tiers
    docs = {t: yaml.safe_load((spec.directory / f"tuned-{t}.yaml").read_text()) for t in ("exact", "any")}
    for tier, doc in docs.items():
        assert doc["tier"] == tier and doc["gate"]["psnr_db_worst"] == {"exact": 100, "any": 0}[tier]
        assert doc["gate"]["psnr_db"] is None and doc["knobs"] == summary["tiers"][tier]["chosen"]
    # only bit-identical output passes "exact" (the cap is 100 dB): caching on tiny changes the output
    assert summary["tiers"]["exact"]["chosen"] == {} or summary["tiers"]["exact"]["final"]["quality"]["identical"]
    faster = [e for e in summary["integrator"] if e["passes_gate"] and e["faster"]]
    assert bool(summary["tiers"]["any"]["chosen"]) == bool(faster) or summary["tiers"]["any"]["rejected"]
    assert (spec.directory / "tuned.yaml").read_text() == (spec.directory / "tuned-exact.yaml").read_text()
    text = (spec.directory / "report.html").read_text()
    assert "id='tiers'" in text and "tuned-any.yaml" in text


def test_the_tiers_settings_are_benched_together_against_one_baseline(tmp_path):
    """Two tiers choosing different settings: one final bench holds both (A B C, C B A, ...), each recorded as
    its own final bench of the same baseline runs, with its own video; the tier loop then reuses them."""
    from vidtune.integrator.combine import combo_key

    spec = _spec(tmp_path, "model=tiny", *SMALL, "name=joint", "families=[caching]", "+tiers.exact.psnr_db_worst=100",
                 "+tiers.any.psnr_db_worst=0")
    c = Campaign(spec, log=lambda line: None)
    pool = _pool(spec)
    c.baseline_ms = pool.get(pool.actors[0].ensure_baseline.remote())["total_ms"]
    a = {"kernel_choice.sdpa_backend": {"video_self": "math"}}
    b = {"sparse_attention.sol": {"beta": 1.0, "dense_layers": 1}}
    finals: dict = {}
    c._bench_together({"exact": a, "any": b, "other": a}, finals, pool)
    assert set(finals) == {combo_key(a), combo_key(b)}
    fa, fb = finals[combo_key(a)], finals[combo_key(b)]
    assert fa["baseline_total_ms"] == fb["baseline_total_ms"] and len(fa["baseline_total_ms"]) == spec.final_repeats
    assert fa["tuned_total_ms"] != fb["tuned_total_ms"] and len(fb["tuned_total_ms"]) == spec.final_repeats
    assert fb["quality"]["psnr_db"] < fa["quality"]["psnr_db"] and fb["benched_with"] == [combo_key(a)]
    assert fb["speedup"] == pytest.approx(statistics.median(fa["baseline_total_ms"]) / statistics.median(fb["tuned_total_ms"]))
    assert (spec.directory / "tuned-exact" / "video.mp4").is_file() and (spec.directory / "tuned-any" / "video.mp4").is_file()
    records = [r for r in _records(spec.directory / "trials.jsonl") if r.get("phase") == "final"]
    assert sorted(r["combo"] for r in records) == sorted(finals)


def test_the_integrator_merges_two_survivors_of_one_family():
    """Campaign h200-19b-1536d: both survivors were kernel_choice's (FP8 + compile + fused norms; FP8 feed-forward
    + SDPA backends + compiled VAE decode), so one candidate per family left nothing to combine. A family's
    candidates now include the merges of two of its survivors (the first one's values win where both set a
    technique, both orders), predicted from the parts' speed-ups; the search proposes the merge, nothing else."""
    from vidtune.integrator.combine import CombinationSearch, combinations, combo_key, family_candidates
    from vidtune.search.campaign import Gate

    a = {"trial": 1, "total_ms": 80.0, "psnr_db": 38.0, "knobs": {
        "kernel_choice.compile": {"mode": "default", "dynamic": False},
        "kernel_choice.fp8_linear": {"layers": "all", "quantiser": "traced"}}}
    b = {"trial": 0, "total_ms": 90.0, "psnr_db": 45.0, "knobs": {
        "kernel_choice.fp8_linear": {"layers": "feed_forward", "quantiser": "traced"},
        "kernel_choice.sdpa_backend": {"video_self": "cudnn"}}}
    merged = family_candidates([a, b], baseline_ms=100.0)[2:]
    assert [m["merged_from"] for m in merged] == [[1, 0], [0, 1]]
    assert merged[0]["knobs"] == {**a["knobs"], "kernel_choice.sdpa_backend": {"video_self": "cudnn"}}
    assert merged[1]["knobs"] == {**b["knobs"], "kernel_choice.compile": {"mode": "default", "dynamic": False}}
    assert merged[0]["total_ms"] == pytest.approx(72.0) and merged[0]["psnr_db"] == 38.0
    assert family_candidates([a, b], merge=False) == [a, b]
    # a merge that adds nothing, or whose techniques conflict (compile and cuda_graphs), is not a candidate
    c = {"trial": 2, "total_ms": 95.0, "psnr_db": 40.0, "knobs": {"kernel_choice.cuda_graphs": {"enabled": True}}}
    d = {"trial": 3, "total_ms": 99.0, "psnr_db": 40.0, "knobs": {"kernel_choice.compile": {"mode": "default"}}}
    assert family_candidates([c, d]) == [c, d]
    assert len(combinations({"kernel_choice": family_candidates([a, b])})) == 4

    search = CombinationSearch({"kernel_choice": [a, b], "caching": []}, Gate(30.0, 0.0, -100.0), seed=3,
                               max_exhaustive=0, trials=2, baseline_ms=100.0, merge=True)
    for s in (a, b):
        search.seed_measured(s["knobs"], _ok(s["total_ms"]))
    proposed = []
    while (setting := search.propose()) is not None:
        assert search._candidate_params(setting)["kernel_choice.candidate"] >= 2  # a merge, not its first part
        proposed.append(setting)
        search.tell(setting, _ok(70.0))
    assert sorted(map(combo_key, proposed)) == sorted(combo_key(m["knobs"]) for m in merged)
    plain = CombinationSearch({"kernel_choice": [a, b]}, Gate(30.0, 0.0, -100.0), max_exhaustive=64, baseline_ms=100.0)
    for s in (a, b):
        plain.seed_measured(s["knobs"], _ok(s["total_ms"]))
    assert plain.propose() is None  # without merges: nothing left (what 1536d's integrator found)


def test_a_first_compile_is_not_started_when_it_would_eat_the_integrators_share_of_the_budget(tmp_path):
    """budget.minutes: before any compile is recorded, a setting that compiles is estimated at
    FIRST_COMPILE_EVALUATIONS evaluations, and it starts only if the reserve after it still holds one combination
    of its cost and the final bench. In h100-19b-1536f the first compile took 258 s where the median said ~71 s,
    and the integrator was left nothing; with budget enough, the same trial starts."""
    from vidtune.budget import FIRST_COMPILE_EVALUATIONS
    from vidtune.jobs import FamilyTrials
    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import append_record, seed_params

    compiling = {"kernel_choice.vae_decode": {"compile": "default"}}
    lines: list[str] = []

    def campaign(name: str, minutes: float) -> Campaign:
        spec = _spec(tmp_path, "model=tiny", f"name={name}", "families=[kernel_choice]", "budget.trials_per_family=9",
                     f"budget.minutes={minutes}", "verdict.seeds=[]", "verdict.prompts=[]")
        for i in range(6):  # 420 s spent on trials that compiled nothing
            append_record(spec, {"family": "kernel_choice", "trial": 100 + i, "status": "ok", "knobs": {},
                                 "timing": {"wall_s": 70.0}})
        c = Campaign(spec, log=lines.append)
        c.baseline_ms = 60_000.0 / spec.final_repeats  # (a final bench of 180 s)
        studies = c._studies()
        params, _ = seed_params("kernel_choice", compiling, spec.worker.request)
        studies["kernel_choice"].enqueue_trial(params, user_attrs={"seeded_from": "hand.yaml"})
        return c, studies

    c, studies = campaign("tight", 15)  # 420 + 210 + (180 + 210) > 900; a median trial (70 s) would fit
    assert c._final_bench_s() == 180.0 and c._evaluation_s_high(compiling) == FIRST_COMPILE_EVALUATIONS * 70.0
    assert not c._over_budget(0, c._final_bench_s())
    families = FamilyTrials(c, studies)
    assert families.next_job() is None and families.next_job() is None
    trials = studies["kernel_choice"].get_trials(deepcopy=False)
    assert [(t.state, t.user_attrs.get("reason")) for t in trials] == [  # (refused once, queued again once)
        (optuna.trial.TrialState.FAIL, "interrupted"), (optuna.trial.TrialState.WAITING, None)]
    assert trials[1].user_attrs["seeded_from"] == "hand.yaml"
    assert any("the families stop here, keeping ~390 s" in line for line in lines)
    c, studies = campaign("roomy", 20)  # 1,020 s of 1,200: it starts
    job = FamilyTrials(c, studies).next_job()
    assert job is not None and job.setting["kernel_choice.vae_decode"]["compile"] == "default"


def test_a_compiling_setting_is_budgeted_at_the_compile_of_the_stages_it_compiles(tmp_path):
    """A setting that compiles new graphs is estimated at an evaluation plus, for each stage it compiles, the
    most a recorded compile of that stage took beyond warm (x1.5): in h100-19b-1536i the 341 s compile trial was
    226 s of the VAE decoder's first compiled run, and an FP8 + compile setting (the transformer's stages only)
    was budgeted at 341 s and never started. A stage no record compiled falls back to the longest compiling
    evaluation (records without first runs, as before)."""
    from vidtune.search.campaign import append_record

    spec = _spec(tmp_path, "model=tiny", "name=by-stage", "families=[kernel_choice]", "budget.run_minutes=9")
    decode = {"kernel_choice.compile": {"mode": "default", "dynamic": False},
              "kernel_choice.vae_decode": {"compile": "default", "channels_last": True, "cudnn_benchmark": True}}
    latency = {"stage1": 2_958.0, "upsample": 32.0, "stage2": 5_882.0, "decode_video": 1_915.0, "decode_audio": 20.0}
    first = {"stage1": 21_958.0, "upsample": 33.0, "stage2": 15_882.0, "decode_video": 228_115.0, "decode_audio": 23.0}
    for i in range(4):
        append_record(spec, {"family": "kernel_choice", "trial": i, "status": "ok", "knobs": {},
                             "timing": {"wall_s": 70.0}})
    append_record(spec, {"family": "kernel_choice", "trial": 4, "status": "ok", "knobs": decode,
                         "latency": {k: {"median_ms": v} for k, v in latency.items()},
                         "timing": {"wall_s": 341.0, "first_run_ms": first}})
    c = Campaign(spec, log=lambda line: None)
    fp8 = {"kernel_choice.fp8_linear": {"layers": "all", "quantiser": "traced"},
           "kernel_choice.compile": {"mode": "default", "dynamic": False}}
    assert c._evaluation_s_high() == 70.0
    assert c._evaluation_s_high(fp8) == pytest.approx(70.0 + 1.5 * (19.0 + 10.0))  # (not 341)
    assert c._evaluation_s_high({"kernel_choice.vae_decode": {"compile": "default"}}) == pytest.approx(
        70.0 + 1.5 * 226.2)
    bare = _spec(tmp_path, "model=tiny", "name=by-stage-bare", "families=[kernel_choice]", "budget.run_minutes=9")
    for i, (knobs, wall) in enumerate([({}, 70.0)] * 4 + [(decode, 341.0)]):
        append_record(bare, {"family": "kernel_choice", "trial": i, "status": "ok", "knobs": knobs,
                             "timing": {"wall_s": wall}})
    assert Campaign(bare, log=lambda line: None)._evaluation_s_high(fp8) == 341.0


def test_a_first_compile_is_priced_from_earlier_campaigns_of_the_model_and_gpu_class(tmp_path):
    """Before a campaign has compiled anything, a compiling setting is priced stage by stage from what earlier
    campaigns of the same model and GPU class (any request, the same results_dir) recorded, not at
    FIRST_COMPILE_EVALUATIONS evaluations; with knowledge=false, or none recorded, as before."""
    from vidtune.budget import FIRST_COMPILE_EVALUATIONS
    from vidtune.search.campaign import append_record, save_spec

    for name, device, stage1_ms in (("first", "cpu (x86_64)", 21_000.0), ("on-a-gpu", "NVIDIA H100 80GB HBM3", 901_000.0)):
        earlier = _spec(tmp_path, "model=tiny", f"name={name}", "families=[kernel_choice]", "request.height=256",
                        "request.width=384")
        save_spec(earlier)
        (earlier.directory / "baseline").mkdir(parents=True)
        (earlier.directory / "baseline" / "meta.json").write_text(json.dumps({"environment": {"device": device}}))
        append_record(earlier, {"family": "kernel_choice", "trial": 0, "status": "ok",
                                "knobs": {"kernel_choice.compile": {"mode": "default", "dynamic": False}},
                                "latency": {"stage1": {"median_ms": 1_000.0}, "stage2": {"median_ms": 2_000.0}},
                                "timing": {"wall_s": 90.0, "first_run_ms": {"stage1": stage1_ms, "stage2": 12_000.0}}})
    fp8 = {"kernel_choice.fp8_linear": {"layers": "all", "quantiser": "traced"},
           "kernel_choice.compile": {"mode": "default", "dynamic": False}}

    def priced(name: str, *overrides: str) -> float:
        spec = _spec(tmp_path, "model=tiny", f"name={name}", "families=[kernel_choice]", "budget.run_minutes=9",
                     *overrides)
        for i in range(4):
            append_record(spec, {"family": "kernel_choice", "trial": i, "status": "ok", "knobs": {},
                                 "timing": {"wall_s": 70.0}})
        return Campaign(spec, log=lambda line: None)._evaluation_s_high(fp8)

    assert priced("second") == pytest.approx(70.0 + 1.5 * (20.0 + 10.0))  # (the H100's compile is another class's)
    assert priced("third", "knowledge=false") == FIRST_COMPILE_EVALUATIONS * 70.0
    assert priced("fourth", "model=ltx2-mini") == FIRST_COMPILE_EVALUATIONS * 70.0  # (another model's compiles)


def test_a_compile_this_run_has_not_built_waits_for_the_next_run_when_it_would_be_cut(tmp_path):
    """budget.run_minutes: a setting whose graphs no actor of this run has built is estimated at the longest
    recorded compiling evaluation, not the upper quartile of all (on the H200 the quartile said 139 s for a
    336 s compile, and the call's limit cut that combination after 300 s). With too little run time left such a
    trial is not started but queued again (its origin kept, not counted), and a combination is withdrawn and
    proposed first by the next run; with enough left, both start."""
    from vidtune.jobs import FamilyTrials
    from vidtune.integrator.combine import CombinationSearch
    from vidtune.model import GenerationRequest
    from vidtune.search.campaign import Gate, append_record, seed_params
    from vidtune.techniques.setting import compile_signature

    compiling = {"kernel_choice.vae_decode": {"compile": "default"}}
    lines: list[str] = []

    def campaign(minutes: float) -> Campaign:
        spec = _spec(tmp_path, "model=tiny", "name=rt", "families=[kernel_choice]", "budget.trials_per_family=3",
                     f"budget.run_minutes={minutes}")
        return Campaign(spec, log=lines.append)

    c = campaign(2)
    for i, (knobs, wall) in enumerate([({}, 10.0)] * 5 + [(compiling, 300.0)]):
        append_record(c.spec, {"family": "kernel_choice", "trial": 100 + i, "status": "ok", "knobs": knobs,
                               "timing": {"wall_s": wall}})
    assert c._evaluation_s_high() == 10.0 and c._evaluation_s_high(compiling) == 300.0
    c.compiled_here.add(compile_signature(compiling))  # built by this run already: its graphs are warm
    assert c._evaluation_s_high(compiling) == 10.0
    c.compiled_here.clear()
    # a compile's wall does not stand for the settings that compile nothing (h200-19b-1536e: 57 s, 10 s and a
    # 246 s compile recorded; the quartile of all three paused a call before a trial of seconds)
    few = _spec(tmp_path, "model=tiny", "name=rt-few", "families=[kernel_choice]", "budget.run_minutes=2")
    for i, (knobs, wall) in enumerate([({}, 57.0), ({}, 10.0), (compiling, 246.0)]):
        append_record(few, {"family": "kernel_choice", "trial": i, "status": "ok", "knobs": knobs,
                            "timing": {"wall_s": wall}})
    cf = Campaign(few, log=lines.append)
    assert cf._evaluation_s_high() == 57.0 and cf._evaluation_s_high({"tiling.vae_tiles": {"spatial_px": 256}}) == 57.0
    assert cf._evaluation_s_high(compiling) == 246.0

    studies = c._studies()
    params, _ = seed_params("kernel_choice", compiling, c.spec.worker.request)
    studies["kernel_choice"].enqueue_trial(params, user_attrs={"seeded_from": "hand.yaml"})
    assert FamilyTrials(c, studies).next_job() is None and c.paused == "the next trial"
    trials = studies["kernel_choice"].get_trials(deepcopy=False)
    assert [(t.state, t.user_attrs.get("reason")) for t in trials] == [
        (optuna.trial.TrialState.FAIL, "interrupted"), (optuna.trial.TrialState.WAITING, None)]
    assert trials[1].system_attrs["fixed_params"] == params and trials[1].user_attrs["seeded_from"] == "hand.yaml"
    assert c._counted(studies["kernel_choice"]) == 0
    assert any("the next trial (~300 s) would end past budget.run_minutes" in line for line in lines)

    roomy = campaign(10)
    job = FamilyTrials(roomy, roomy._studies()).next_job()
    assert job is not None and {n: get(n).validate(v) for n, v in job.setting.items()} == {
        n: get(n).validate(v) for n, v in compiling.items()}

    survivors = {"kernel_choice": [{"knobs": compiling, "total_ms": 90.0}],
                 "tiling": [{"knobs": {"tiling.vae_tiles": {"spatial_px": 256}}, "total_ms": 95.0}]}
    search = CombinationSearch(survivors, Gate(psnr_db=35.0), max_exhaustive=64, baseline_ms=100.0)
    first = search.propose()
    search.withdraw(first)
    assert not search.pending and search.propose() == first


def test_a_campaign_resumed_with_another_quality_request_is_refused_before_any_work(tmp_path):
    """A campaign folder whose stored spec measured quality at one quality-model request is not resumed at
    another (a changed quality_model.*, or the auto size of another vidtune): the error names the stored values
    to pass; the same request resumes."""
    from vidtune.search.campaign import SearchSpaceError, check_resumed_quality, save_spec

    first = _spec(tmp_path, "model=tiny", "quality_model.model=ltx2-mini", "name=qr")
    save_spec(first)
    check_resumed_quality(_spec(tmp_path, "model=tiny", "quality_model.model=ltx2-mini", "name=qr"))
    other = _spec(tmp_path, "model=tiny", "quality_model.model=ltx2-mini", "quality_model.height=128", "name=qr")
    with pytest.raises(SearchSpaceError, match="quality_model.height=256 quality_model.width=384 quality_model.frames=17"):
        Campaign(other, log=lambda line: None).run()
    save_spec(_spec(tmp_path, "model=tiny", "name=qs"))  # quality from the model itself
    with pytest.raises(SearchSpaceError, match="quality_model.model=self"):
        check_resumed_quality(_spec(tmp_path, "model=tiny", "quality_model.model=ltx2-mini", "name=qs"))


def test_the_dashboard_serves_the_campaigns_studies_on_loopback(finished_campaign):
    """`vidtune dashboard NAME` serves the campaign's own storage in optuna-dashboard on 127.0.0.1: its API lists the
    families' studies, and a measured trial carries its ratio, interval and quality as user attributes."""
    pytest.importorskip("optuna_dashboard")
    import socket
    import urllib.request

    _, spec, _, _ = finished_campaign
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "vidtune.cli", "dashboard", spec.name, "--results-dir",
                             spec.results_dir, "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while True:
            try:
                studies = json.loads(urllib.request.urlopen(f"{base}/api/studies", timeout=5).read())["study_summaries"]
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
                time.sleep(0.5)
        ids = {s["study_name"]: s["study_id"] for s in studies}
        assert set(ids) == {"e2e:caching", "e2e:tiling"}
        trials = [t for name in ids for t in json.loads(urllib.request.urlopen(
            f"{base}/api/studies/{ids[name]}", timeout=10).read())["trials"]]
        attrs = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in trials if t["state"] == "Complete"]
        assert attrs and all("psnr_db" in a and "knobs" in a for a in attrs)
        timed = [a for a in attrs if "paired" in a]
        assert all("ratio" in a and "interval" in a and "peak_memory_gb" in a for a in timed)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # refused before anything is served: a non-loopback address without --public, a campaign that is not there
    assert main(["dashboard", spec.name, "--results-dir", spec.results_dir, "--host", "0.0.0.0"]) == 2
    assert main(["dashboard", "nope", "--results-dir", spec.results_dir]) == 2


def test_the_campaign_gives_its_progress_as_a_status_with_the_fraction_done(finished_campaign, tmp_path):
    """The driver hands its progress line to ``status`` with the fraction done (elapsed over elapsed plus the ETA),
    which a terminal draws as a bar (search/progress.TerminalLog); the other lines stay ``log``'s."""
    import dataclasses

    from vidtune.search.storage import storage_for

    _, spec, summary, _ = finished_campaign
    shutil.copytree(spec.directory, tmp_path / spec.name, ignore=shutil.ignore_patterns("*.lock"))
    copy = dataclasses.replace(spec, results_dir=str(tmp_path))
    got: list[tuple[str, float | None]] = []
    campaign = Campaign(copy, log=lambda m: None, status=lambda line, fraction=None: got.append((line, fraction)))
    campaign.baseline_ms = summary["baseline"]["total_ms"]
    storage = storage_for(copy)
    studies = {f: optuna.load_study(study_name=f"{spec.name}:{f}", storage=storage) for f in spec.families}
    campaign._progress(studies, [], 1, time.time())
    campaign._progress(studies, [2.0, 4.0], 1, time.time() - 30)
    assert got[0][1] == 0.0 and re.search(r"caching \d+/3 .*\| tiling \d+/3", got[0][0])  # (agents' tells add trials)
    assert "ETA" in got[1][0] and 0 < got[1][1] < 1


def test_a_pool_adopted_by_a_second_campaign_serves_it_as_a_new_actor_would(tmp_path):
    """Two campaigns of different requests and families, one after the other in this process on one pool
    (``Campaign(spec, pool=...)``): the same actor serves both (no second start), each campaign's baseline and
    trials are of its own request, and the pool is left running for its owner; a campaign the pool does not fit
    (another actor count) is refused before any work, naming what differs."""
    from vidtune.pool import actor_key

    first = _spec(tmp_path / "a", "model=tiny", *SMALL, "name=a", "families=[caching]", "budget.trials_per_family=1")
    second = _spec(tmp_path / "b", "model=tiny", "request.height=192", "request.width=256", "request.frames=9",
                   "name=b", "families=[tiling]", "budget.trials_per_family=1")
    pool = ActorPool(first)
    try:
        actor = actor_key(pool.actors[0])
        a = Campaign(first, log=lambda line: None, pool=pool).run()
        b = Campaign(second, log=lambda line: None, pool=pool).run()
        assert [actor_key(x) for x in pool.actors] == [actor]  # the same actor, alive after both
        assert pool.ray.get(pool.actors[0].ping.remote()) == "ok"
        assert a["baseline"]["key"] != b["baseline"]["key"]
        meta = json.loads((second.directory / "baseline" / "meta.json").read_text())
        assert (meta["request"]["height"], meta["request"]["width"]) == (192, 256)
        records = _records(second.directory / "trials.jsonl")
        assert {r["family"] for r in records if r["family"] != "integrator"} == {"tiling"}
        with pytest.raises(ValueError, match="cannot serve a campaign"):
            pool.adopt(_spec(tmp_path / "c", "model=tiny", *SMALL, "name=c", "ray.num_actors=2"))
    finally:
        pool.shutdown()
