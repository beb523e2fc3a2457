"""Parallelism family on the CPU: real gloo process groups of 2 and 4 processes on the tiny preset.

Each strategy's output is compared with one process running the same calls (benchmarks/parallel_check.py
states the bounds: on the CPU every strategy measured bit-identical, so the bound here is equality).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
import torch

from vidtune.kernels.lse_attention import attention_with_lse, merge_partials
from vidtune.model import ReferencePipeline
from vidtune.benchmarks.parallel_check import check
from vidtune.techniques import CompositionError, KnobError, get
from vidtune.techniques.parallelism.distributed import plan_world
from vidtune.techniques.setting import check_composition, compose


@pytest.fixture(scope="module", params=[2, 4], ids=["gloo2", "gloo4"])
def report(request):
    return request.param, check(preset="tiny", nproc=request.param)


def test_every_strategy_matches_one_process(report):
    nproc, rep = report
    expected = {"guidance_parallel", "tile_parallel", "sequence_allgather_gatherkv",
                "sequence_allgather_lse_first_block", "kernel_ulysses", "kernel_lse"}
    if nproc == 2:  # the tiny preset has 2 video heads: Ulysses splits them over 2 ranks, not 4
        expected.add("sequence_ulysses_lse")
    assert set(rep) == expected
    for name, r in rep.items():
        assert r["ok"], (name, r)
        assert r["ranks_identical"], name
    for name in expected - {"kernel_lse"}:
        assert rep[name]["max_abs_diff"] == 0.0, name


def test_work_is_actually_split(report):
    nproc, rep = report
    gp = rep["guidance_parallel"]["stats_rank0"]["parallelism.guidance_parallel"]
    assert gp["passes_per_step"] == 4 and gp["passes_on_this_rank"] == 4 // nproc
    # one process ran all four passes per step; rank 0 ran only its own
    assert rep["guidance_parallel"]["stats_rank0"]["stage1.passes"] * nproc == \
        rep["guidance_parallel"]["stats_reference"]["stage1.passes"]
    tp = rep["tile_parallel"]["stats_rank0"]["parallelism.tile_parallel"]
    assert tp["tiles"] == 4 and tp["tiles_on_this_rank"] == 4 // nproc
    sp = rep["sequence_allgather_lse_first_block"]["stats_rank0"]
    # the cache skipped a step and took the same decisions as one process (reduced statistic)
    assert sp["caching.first_block"] == rep["sequence_allgather_lse_first_block"]["stats_reference"]["caching.first_block"]
    assert sp["caching.first_block"]["stage1"]["cached"] >= 1
    # partial outputs + log-sum-exp move fewer bytes than the gathered keys and values
    lse_bytes = sp["parallelism.sequence_parallel"]["bytes_sent_per_rank"]["v2a"]
    gkv_bytes = rep["sequence_allgather_gatherkv"]["stats_rank0"]["parallelism.sequence_parallel"]["bytes_sent_per_rank"]["v2a"]
    assert 0 < lse_bytes and 0 < gkv_bytes


@pytest.mark.parametrize("split", [[37], [10, 50, 90], [0, 100], [100]])
def test_lse_merge_equals_full_attention(split):
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 13, 64, generator=g), torch.randn(2, 100, 64, generator=g), torch.randn(2, 100, 64, generator=g)
    full, full_lse = attention_with_lse(q, k, v, heads=4)
    edges = [0, *split, 100]
    parts = [attention_with_lse(q, k[:, a:b], v[:, a:b], heads=4) for a, b in zip(edges, edges[1:])]
    out, lse = merge_partials(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    # float32 throughout: the merge only reorders sums (bound: a few float32 ulps of O(1) values)
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, full_lse, atol=1e-5, rtol=1e-5)
    ref = torch.softmax(q.reshape(2, 13, 4, 16).transpose(1, 2) @ k.reshape(2, 100, 4, 16).transpose(1, 2).transpose(-1, -2)
                        / 4.0, -1) @ v.reshape(2, 100, 4, 16).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_launched_ranks_keep_nvlink_multicast_off(monkeypatch):
    # The device hosts' rule (KINDS.md): NVLink multicast stays off in NCCL, PyTorch and NVSHMEM in every
    # process. launch sets the variables where they are unset and keeps values already set.
    from vidtune.benchmarks.parallel_check import rank_environment
    from vidtune.techniques.parallelism.distributed import NO_MULTICAST, launch

    for key in NO_MULTICAST:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "yes")
    ranks = launch(rank_environment, 2, sorted(NO_MULTICAST))
    assert ranks == [{"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "yes", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}] * 2


def test_ranks_fork_from_a_server_that_imported_the_pipeline_and_get_their_creators_state(monkeypatch, tmp_path):
    """``launch``'s ranks fork from a forkserver that imported torch, ltx-core and ltx-pipelines once (``spawn``
    imported them in every rank: ~5 s of CPU each), and still see their creator's environment and working
    directory as they are at the launch, not as they were when the server started."""
    from vidtune._compat import CHILD_PRELOAD
    from vidtune.benchmarks.parallel_check import rank_environment, rank_start
    from vidtune.techniques.parallelism.distributed import launch

    launch(rank_environment, 2, [])  # (the server exists from here on, whatever test started it)
    monkeypatch.setenv("VIDTUNE_RANK_PROBE", "after the server started")
    monkeypatch.chdir(tmp_path)
    assert launch(rank_environment, 2, ["VIDTUNE_RANK_PROBE"]) == [{"VIDTUNE_RANK_PROBE": "after the server started"}] * 2
    for rank in launch(rank_start, 2):
        assert rank["cwd"] == str(tmp_path)
        assert "ltx_pipelines.utils.helpers" in rank["preloaded"] and set(rank["preloaded"]) == set(CHILD_PRELOAD)


def test_children_are_spawned_on_a_cuda_host(monkeypatch):
    """Where CUDA is available, the children are spawned: the forkserver's imports would initialise CUDA there
    (ltx-pipelines calls ``torch.cuda.is_available()`` at import), and a forked child could not use it."""
    from vidtune._compat import child_context

    assert child_context().get_start_method() == "forkserver"  # (this CPU machine)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert child_context().get_start_method() == "spawn"


def test_guidance_ranks_compute_their_passes_at_the_same_time():
    # Each pass is held 0.25 s. If a rank waits for another's pass before starting its own (the bug the
    # H200 pair showed: no speed-up on two GPUs), the passes of the two ranks run in turn and the step
    # lasts at least their summed time; working side by side it lasts about half of it.
    from vidtune.benchmarks.parallel_check import guidance_pass_intervals
    from vidtune.techniques.parallelism.distributed import launch

    ranks = launch(guidance_pass_intervals, 2, 0.25)
    assert [len(r) for r in ranks] == [4, 4]  # 2 steps x 4 guidance passes, half on each rank
    everything = [iv for r in ranks for iv in r]
    busy = sum(end - start for start, end in everything)
    span = max(end for _, end in everything) - min(start for start, _ in everything)
    assert span < 0.75 * busy, (span, busy)


@pytest.mark.parametrize("name", ["parallelism.guidance_parallel", "parallelism.sequence_parallel",
                                  "parallelism.tile_parallel"])
def test_degree_beyond_the_world_is_a_clear_error_not_a_hang(name, tiny_models, tiny_request):
    tech = get(name)
    request = tiny_request if name != "parallelism.guidance_parallel" else \
        type(tiny_request).from_dict({**tiny_request.to_dict(), "mode": "multistep"})
    values = tech.validate({"degree": 2})
    with pytest.raises(KnobError, match=rf"{name}\.degree=2 needs a multiple of 2 processes but this is one process"):
        tech.check_request(values, request)
    pipe = ReferencePipeline(tiny_models)
    with pytest.raises(KnobError, match=rf"{name}\.degree=2"):
        tech.apply(pipe, values)
    plan_world(2)
    try:
        tech.check_request(values, request)  # a planned 2-process world accepts it ...
        with pytest.raises(KnobError, match="divides 2"):
            tech.check_request(tech.validate({"degree": 4}), request)  # ... and rejects 4
    finally:
        plan_world(1)


def test_guidance_parallel_needs_multistep(tiny_request):
    tech = get("parallelism.guidance_parallel")
    with pytest.raises(KnobError, match="needs request.mode=multistep"):
        tech.check_request(tech.validate({"degree": 2}), tiny_request)


def test_two_parallel_strategies_are_rejected_together():
    with pytest.raises(CompositionError, match="parallel.ranks"):
        check_composition({"parallelism.tile_parallel": {"degree": 2}, "parallelism.sequence_parallel": {"degree": 2}})


def test_sequence_parallel_checks_heads_and_sparse_attention(tiny_models):
    pipe = ReferencePipeline(tiny_models)
    sp = get("parallelism.sequence_parallel")
    with pytest.raises(KnobError, match=r"comm=ulysses needs the video heads \[2\] to divide by degree=4"):
        sp.apply(pipe, {"degree": 4, "comm": "ulysses"})
    with compose(pipe, {"sparse_attention.sol": {"beta": 1.0}}):
        with pytest.raises(KnobError, match="needs whole query sequences; use comm=ulysses"):
            sp.apply(pipe, {"degree": 2, "comm": "allgather_kv"})


def test_parallelism_applies_after_other_techniques():
    active = check_composition({"parallelism.sequence_parallel": {"degree": 2},
                                "sparse_attention.sol": {"beta": 1.0},
                                "tiling.stage2_tiles": {"rows": 2, "cols": 2, "overlap": 2}})
    assert [t.name for t, _ in active][-1] == "parallelism.sequence_parallel"


def test_cli_generate_nproc_writes_one_output_equal_to_one_process(tmp_path):
    """`vidtune generate --nproc 2` with tile_parallel: rank 0's video equals a one-process run."""
    common = ["request.height=128", "request.width=192", "request.frames=9", "eval.stage2_tiles.rows=1",
              "eval.stage2_tiles.cols=2", "eval.stage2_tiles.overlap=1", f"results_dir={tmp_path}"]

    def run(out, *extra):
        proc = subprocess.run([sys.executable, "-m", "vidtune.cli", "generate", *common, f"out={tmp_path / out}", *extra],
                              capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", **_env()})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    par = run("par", "--nproc", "2", "--knobs", "parallelism.tile_parallel.degree=2")
    assert par["stats"]["parallelism.tile_parallel"] == {"degree": 2, "tiles": 2, "tiles_on_this_rank": 1, "idle_ranks": 0}
    from safetensors.torch import load_file

    from vidtune.settings import Settings, load_config

    # the one-process run in this process, on one thread as each rank ran (a third CLI process cost ~10 s of CPU)
    settings, threads = Settings(load_config(common)), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = settings.pipeline().run(settings.request)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(load_file(par["raw"])["frames"], one.frames)
    assert sorted(p.name for p in (tmp_path / "par").iterdir()) == ["output.safetensors", "video.mp4"]


def test_cli_evaluate_and_bench_nproc_measure_a_parallel_setting(tmp_path, capsys):
    """`vidtune evaluate --nproc 2` and `vidtune bench --nproc 2 --knobs ...` run the setting on two gloo
    ranks against the one-process baseline: tile_parallel gives rank 0 one tile of two and the output
    stays bit-identical; bench alternates baseline and setting (one total each per repeat). bench
    without --config or --knobs, or with both, is refused by name before any model is built."""
    common = ["request.height=128", "request.width=192", "request.frames=9", "eval.stage2_tiles.rows=1",
              "eval.stage2_tiles.cols=2", "eval.stage2_tiles.overlap=1", "eval.repeats=1", "eval.warmup=0",
              f"results_dir={tmp_path}", "name=np"]
    env = {"OMP_NUM_THREADS": "1", "VIDTUNE_CACHE": str(tmp_path / "cache"), **_env()}

    def run(*args, code=0):
        proc = subprocess.run([sys.executable, "-m", "vidtune.cli", *args], capture_output=True, text=True,
                              timeout=600, env=env)
        assert proc.returncode == code, proc.stderr[-3000:]
        return proc

    knobs = ["--knobs", "parallelism.tile_parallel.degree=2"]
    ev = json.loads(run("evaluate", *common, "--nproc", "2", *knobs, "--json").stdout)
    assert ev["nproc"] == 2 and ev["quality"]["identical"] and ev["baseline_reused"] is False
    assert ev["stats"]["parallelism.tile_parallel"]["tiles_on_this_rank"] == 1
    assert ev["start_stage"] == "stage2"  # tile_parallel acts from stage 2; earlier stages come from the baseline
    assert set(ev["latency_ms"]) == {"stage1", "upsample", "stage2", "decode_video", "decode_audio"}
    proc = run("bench", *common, "--nproc", "2", *knobs, "--repeats", "2")
    bench = json.loads(proc.stdout)
    # progress on stderr, once (rank 0): where a long bench is when it is cut
    assert proc.stderr.count("bench: repeat 2/2 (B A): baseline ") == 1 and "bench: baseline reused" in proc.stderr
    assert proc.stderr.count("bench: stage2 ") == 1 and set(bench["stages"]) == set(ev["latency_ms"])
    assert bench["nproc"] == 2 and bench["quality"]["identical"]
    assert len(bench["baseline_total_ms"]) == len(bench["tuned_total_ms"]) == 2
    assert bench["speedup"] == pytest.approx(statistics.median(bench["baseline_total_ms"])
                                             / statistics.median(bench["tuned_total_ms"]), rel=1e-3)
    assert "2 processes" in bench["method"]
    assert bench["warnings"] == [] and ev["warnings"] == []  # two tiles for two ranks: nothing idle
    from vidtune.cli import main

    capsys.readouterr()  # (the refusals in this process: no model is built, so no process of their own is needed)
    assert main(["bench", *common]) == 2 and "bench needs --config tuned.yaml or --knobs" in capsys.readouterr().err
    assert main(["bench", *common, "--config", "t.yaml", *knobs]) == 2 and "not both" in capsys.readouterr().err


def test_cli_rejects_degree_without_processes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vidtune.cli", "generate", f"results_dir={tmp_path}", "--knobs",
                           "parallelism.sequence_parallel.degree=2"], capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 2
    assert "parallelism.sequence_parallel.degree=2 needs a multiple of 2 processes" in proc.stderr
    assert "--nproc 2" in proc.stderr


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}


def _worker_spec(tmp_path, **tiling):
    from vidtune.search.worker import WorkerSpec

    return WorkerSpec(source={"preset": "tiny"},
                      request={"prompt": "x", "seed": 1, "height": 128, "width": 192, "frames": 9, "fps": 24.0},
                      device="cpu", stage2_tiling=tiling, repeats=1, warmup=0, baseline_dir=str(tmp_path / "baseline"))


def test_parallel_trial_worker_evaluates_settings_on_two_ranks(tmp_path):
    """A worker owning 2 gloo ranks: parallel settings run on both; invalid degrees fail on every rank
    at once (no hang); the records are rank 0's."""
    from vidtune.search.parallel_worker import ParallelTrialWorker

    keys = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    env_before = {key: os.environ.get(key) for key in keys}
    w = ParallelTrialWorker(_worker_spec(tmp_path, rows=1, cols=2, overlap=1), 2, timeout_s=120)
    assert {key: os.environ.get(key) for key in keys} == env_before  # the world's address is not in os.environ
    try:
        w.ensure_baseline()
        ok = w.evaluate({"parallelism.tile_parallel": {"degree": 2}})
        assert ok["status"] == "ok" and ok["ranks"] == 2
        assert ok["stats"]["parallelism.tile_parallel"]["tiles_on_this_rank"] == 1
        assert ok["quality"]["identical"]  # bit-identical to the one-process baseline
        # one stage-2 tile: both ranks denoise the whole frame; recorded and warned (the output differs
        # from the baseline's, which has two tiles)
        # (on two H200s this setting measured x0.99: results/benchmarks/parallel/README.md, round 3)
        one = w.evaluate({"parallelism.tile_parallel": {"degree": 2},
                          "tiling.stage2_tiles": {"rows": 1, "cols": 1, "overlap": 0}})
        rec = one["stats"]["parallelism.tile_parallel"]
        assert one["status"] == "ok" and not one["quality"]["identical"]
        assert (rec["tiles"], rec["tiles_on_this_rank"], rec["idle_ranks"]) == (1, 1, 1)
        assert "the whole frame on every rank" in rec["warning"] and "rows x cols >= 2" in rec["warning"]
        bad = w.evaluate({"parallelism.sequence_parallel": {"degree": 4}})
        assert bad["status"] == "fail" and bad["reason"] == "invalid" and "needs a multiple of 4" in bad["message"]
        after = w.evaluate({"parallelism.sequence_parallel": {"degree": 2, "comm": "allgather_kv", "v2a": "gather_kv"}})
        assert after["status"] == "ok" and after["quality"]["identical"]  # the group still works after a failure
    finally:
        w.close()
    # nor after it closes: a process started afterwards (a CLI run) once inherited WORLD_SIZE=2 and waited
    # for a rank 1 until its timeout
    assert {key: os.environ.get(key) for key in keys} == env_before


@pytest.mark.parametrize("world,expected", [(1, []), (2, [2]), (4, [2, 4])])
def test_only_feasible_degrees_are_sampled(world, expected):
    """A used parallel technique samples degrees the world holds, never its off value 1 (a trial that
    measures the baseline again); in a world of one it is not offered at all."""
    import optuna

    plan_world(world)
    try:
        tech = get("parallelism.tile_parallel")
        seen = set()
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        assert tech.applicable() == bool(expected)
        if not expected:
            with pytest.raises(KnobError, match="no value but the off one"):
                tech.suggest(study.ask())
            return
        for _ in range(30):
            trial = study.ask()
            seen.add(tech.suggest(trial)["degree"])
            study.tell(trial, 0.0)
        assert sorted(seen) == expected
    finally:
        plan_world(1)


def test_search_skips_tile_parallel_when_stage2_has_one_tile(tiny_request):
    """With one stage-2 tile every rank denoises the whole frame (x0.99 on two H200s, round 3), so the
    search treats tile_parallel as a no-op there. The tile count follows the tiling the campaign plans
    (its eval.stage2_tiles), else the reference default: one tile up to ~32k tokens (1536x1024x121
    included), a grid at 4K."""
    import optuna

    from vidtune.model import GenerationRequest
    from vidtune.model.tiles import Stage2Tiling
    from vidtune.search.campaign import sample_family_setting
    from vidtune.techniques.parallelism.tile_parallel import planned_stage2_tiling

    tech = get("parallelism.tile_parallel")
    on = tech.validate({"degree": 2})
    size = {"prompt": "x", "seed": 1, "fps": 24.0, "frames": 121}
    assert not tech.effective(on, tiny_request)
    assert not tech.effective(on, GenerationRequest(**size, height=1024, width=1536))
    assert tech.effective(on, GenerationRequest(**size, height=2176, width=3840))

    def sampled(n: int = 40) -> set[str]:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        names: set[str] = set()
        for _ in range(n):
            trial = study.ask()
            names |= set(sample_family_setting(trial, "parallelism", tiny_request))
            study.tell(trial, 0.0)
        return names

    plan_world(2)
    try:
        assert "parallelism.tile_parallel" not in sampled()
        with planned_stage2_tiling(Stage2Tiling(rows=1, cols=2, overlap=1)):
            assert tech.effective(on, tiny_request)
            assert "parallelism.tile_parallel" in sampled()
    finally:
        plan_world(1)
    assert not tech.effective(on, tiny_request)


def test_campaign_searches_the_parallelism_family_on_two_rank_actors(tmp_path):
    """A real campaign (Ray actor owning 2 gloo ranks) over the parallelism family on the tiny preset."""
    from vidtune.cli import Settings, load_config
    from vidtune.driver import Campaign

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # (model=tiny as the docstring says: without it the campaign ran on the default ltx2-mini; the single gate
    # its gate.psnr_db is for: the tiers have tests of their own)
    spec = Settings(load_config([f"results_dir={tmp_path}", "name=par", "model=tiny", "tiers=none", "families=[parallelism]",
                                 "budget.trials_per_family=4", "ray.ranks_per_actor=2", "eval.repeats=1",
                                 "eval.warmup=0", "integrator.final_repeats=1", "integrator.max_p_value=1", "request.height=128",
                                 "request.width=192", "request.frames=9", "gate.psnr_db=30"])).campaign_spec()
    try:
        summary = Campaign(spec, log=lambda *_: None).run()
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        plan_world(1)
    records = [json.loads(line) for line in (spec.directory / "trials.jsonl").read_text().splitlines()]
    records = [r for r in records if r["family"] == "parallelism"]  # (the integrator's record follows)
    assert len(records) == 4
    degrees = {r["params"].get(f"{name}.degree") for r in records for name in
               ("parallelism.guidance_parallel", "parallelism.sequence_parallel", "parallelism.tile_parallel")}
    assert degrees - {None} <= {1, 2}  # never a degree the 2-rank actors cannot hold
    assert all(r["status"] == "ok" or r["reason"] == "invalid" for r in records)
    assert any(r["status"] == "ok" and r.get("ranks") == 2 for r in records)
    assert (spec.directory / "tuned.yaml").is_file() and summary["final"]["speedup"] > 0


def test_parallel_benchmark_runs_every_case_on_two_gloo_ranks(tmp_path):
    """The multi-GPU benchmark script, on the CPU: every case runs, and the strategies that keep the
    arithmetic are exact against one rank (the log-sum-exp case changes v2a's arithmetic: bounded)."""
    from vidtune.benchmarks.bench_parallel import main as bench_main

    out = tmp_path / "bp.json"
    assert bench_main(["--world", "2", "--preset", "tiny", "--layers", "0", "--repeats", "1", "--out", str(out),
                       "--cases", "sequence@384x256x17", "sequence_gather@384x256x17", "guidance@384x256x17",
                       "tile@384x256x17"]) == 0
    doc = json.loads(out.read_text())
    cases = doc["cases"]
    assert all("failed" not in c for c in cases.values()), cases
    for name in ("sequence_gather@384x256x17", "guidance@384x256x17", "tile@384x256x17"):
        assert cases[name]["max_abs_diff_vs_one_rank"] == 0.0, name
    # one pass: float32 attention merged by log-sum-exp vs one bf16 SDPA kernel (measured 0.125)
    assert cases["sequence@384x256x17"]["max_abs_diff_vs_one_rank"] < 0.5
    bytes_lse = cases["sequence@384x256x17"]["stats"]["parallelism.sequence_parallel"]["bytes_sent_per_rank"]["v2a"]
    bytes_kv = cases["sequence_gather@384x256x17"]["stats"]["parallelism.sequence_parallel"]["bytes_sent_per_rank"]["v2a"]
    assert bytes_lse > 0 and bytes_kv > 0
    assert cases["tile@384x256x17"]["stats"]["parallelism.tile_parallel"]["tiles_on_this_rank"] == 2


def test_campaign_refuses_the_parallelism_family_on_one_rank_actors(tmp_path, capsys):
    from vidtune.cli import main as cli_main

    assert cli_main(["campaign", f"results_dir={tmp_path}", "families=[parallelism]"]) == 2
    assert "parallelism needs ray.ranks_per_actor >= 2" in capsys.readouterr().err
