"""Faults injected where they happen: torn records, writes cut by a kill or a full disk, non-finite and unbounded
numbers from users and agents, a tell against a driver's live lease, pathological config files, storage errors.
Each refused before any model work (exit 2, one line naming the field) or survived with nothing lost."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import yaml

from vidtune._io import OutputError, atomic_write_text, load_user_yaml
from vidtune.cli import Settings, load_config, main
from vidtune.search.campaign import (StorageError, ask_trial, live_lease, load_spec, rdb_storage, save_spec,
                                     storage_for, tell_result, tell_trial)
from vidtune.search.records import RecordLog


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("vidtune: error: ") and "Traceback" not in err, err[-2000:]
    return err


# ---------------------------------------------------------------------- the record log
def test_a_torn_record_is_skipped_on_read_and_cut_back_before_the_next_append(tmp_path):
    log = RecordLog(tmp_path / "trials.jsonl")
    log.append({"trial": 0, "status": "ok"})
    log.append({"trial": 1, "status": "ok"})
    with open(log.path, "ab") as f:
        f.write(b'{"trial": 2, "sta')  # a kill mid-write
    assert [r["trial"] for r in log.read()] == [0, 1]
    assert log.damaged_lines() == [3]
    message = log.append({"trial": 3, "status": "ok"})
    assert message and "torn" in message
    assert [r["trial"] for r in log.read()] == [0, 1, 3]  # (before: trial 3 glued to the torn line and lost)
    kept = list(tmp_path.glob("trials.jsonl.torn-*"))
    assert len(kept) == 1 and kept[0].read_bytes().endswith(b'"sta')
    # a garbled last line that did get its newline is a torn write too
    with open(log.path, "ab") as f:
        f.write(b'{"trial": 4,\n')
    log.append({"trial": 5})
    assert [r["trial"] for r in log.read()] == [0, 1, 3, 5] and not log.damaged_lines()


def test_an_append_on_a_full_disk_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    log = RecordLog(tmp_path / "trials.jsonl")
    log.append({"trial": 0})
    before = log.path.read_bytes()
    real_write = os.write

    def full(fd, data):  # the disk fills half-way through the line
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OutputError, match="was not written"):
        log.append({"trial": 1, "status": "ok"})
    monkeypatch.undo()
    assert log.path.read_bytes() == before


def test_records_are_standard_json(tmp_path):
    log = RecordLog(tmp_path / "trials.jsonl")
    log.append({"quality": {"psnr_db": float("inf"), "flip": float("nan")}})
    text = log.path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard {c}"))["quality"]["flip"] is None


# ---------------------------------------------------------------------- atomic writes
def test_a_write_killed_at_any_moment_leaves_the_old_file_or_the_new_one(tmp_path):
    """SIGKILL a process that rewrites a file in a loop, many times: the file is always one whole version
    (before: ``signoff`` killed mid-write left tuned.yaml at 0 bytes)."""
    target = tmp_path / "tuned.yaml"
    pad = 1 << 20  # (1 MiB: the kernel copies it in many steps, so a kill can land inside a plain write)
    texts = [f"version: {v}\npad: {'x' * pad}\n" for v in (-1, 0, 1)]
    atomic_write_text(target, texts[0])
    script = textwrap.dedent(f"""
        import sys, yaml
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from vidtune._io import atomic_write_text
        texts = [f"version: {{v}}\\npad: {{'x' * {pad}}}\\n" for v in (0, 1)]
        print("ready", flush=True)
        i = 0
        while True:
            atomic_write_text({str(target)!r}, texts[i % 2])
            i += 1
    """)
    versions = set()
    for kill_after_s in (0.0, 0.003, 0.007, 0.013, 0.021, 0.031, 0.05, 0.1):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"  # (after the imports: writes are in flight from here)
        time.sleep(kill_after_s)
        p.send_signal(signal.SIGKILL)
        p.wait()
        text = target.read_text()
        assert text in texts, f"torn after {kill_after_s} s: {len(text)} characters"
        versions.add(texts.index(text))
    assert len(versions) > 1  # the writer did get through several versions
    # a failed write (a full disk) leaves the file as it was and no temporary file
    old = target.read_bytes()
    with pytest.raises(OutputError, match="no space left"):
        from vidtune._io import atomic_path

        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_bytes() == old


def test_a_full_disk_is_refused_before_the_first_generation(tmp_path, capsys, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(2 << 20, 2 << 20, 1 << 20))  # a 1 MiB-free disk
    t0 = time.time()
    assert main(["generate", "model=tiny", f"results_dir={tmp_path}", "request.height=512", "request.width=768"]) == 2
    err = _one_error_line(capsys)
    assert "results_dir=" in err and "MiB free" in err and time.time() - t0 < 20
    assert not list(tmp_path.rglob("*.mp4")) and not list(tmp_path.rglob("*.safetensors"))
    assert main(["generate", "model=tiny", f"results_dir={tmp_path}", f"out={tmp_path / 'o'}"]) == 2
    assert "out=" in _one_error_line(capsys)


def test_a_failed_mp4_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import torch

    from vidtune.model import media

    frames = torch.zeros(3, 64, 64, 3, dtype=torch.uint8)

    def broken(av, path, *args):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(media, "_encode_mp4", broken)
    with pytest.raises(OutputError):
        media.write_mp4(tmp_path / "video.mp4", frames, 24.0, None, 16000)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- numbers from users and agents
@pytest.mark.parametrize("override,needle", [
    ("gate.psnr_db=nan", "gate.psnr_db must be a number or null (not gated), finite"),
    ("gate.flip=inf", "gate.flip must be a number or null"),
    ("gate.flip=2", "in [0, 1]"),
    ("+tiers.loose.psnr_db=-inf", "tiers.loose.psnr_db must be a number"),
    ("budget.minutes=inf", "budget.minutes must be null or a number of minutes > 0 (finite"),
    ("budget.run_minutes=nan", "budget.run_minutes must be null"),
    ("budget.trial_timeout_s=inf", "budget.trial_timeout_s must be a number of seconds > 0 (finite"),
    ("budget.trial_timeout_s=1e300", "at most 2592000"),
    ("eval.repeats=1000000000", "eval.repeats must be an integer >= 1 (at most"),
    ("eval.memory_budget_gb=inf", "eval.memory_budget_gb must be null"),
    ("integrator.max_p_value=nan", "integrator.max_p_value must be a number in (0, 1]"),
])
def test_non_finite_and_unbounded_numbers_are_refused_before_any_work(tmp_path, capsys, override, needle):
    assert main(["campaign", "model=tiny", f"results_dir={tmp_path}", override]) == 2
    assert needle in _one_error_line(capsys)
    assert not any(tmp_path.iterdir())  # nothing written: no spec saved with a NaN in it


@pytest.mark.parametrize("args,needle", [
    (["bench", "--repeats", "0"], "--repeats must be an integer in [1, 10000]"),
    (["bench", "--repeats", "1000000000"], "--repeats must be an integer in [1, 10000]"),
    (["evaluate", "--nproc", "100000"], "--nproc must be an integer in [1, 1024]"),
])
def test_unbounded_command_options_are_refused(tmp_path, capsys, args, needle):
    assert main([*args, "model=tiny", f"results_dir={tmp_path}"]) == 2
    assert needle in _one_error_line(capsys) and not any(tmp_path.iterdir())


@pytest.fixture()
def asked_campaign(tmp_path):
    """A campaign folder with its spec and an empty caching study, as `vidtune campaign` leaves them."""
    spec = Settings(load_config(["model=tiny", f"results_dir={tmp_path}", "name=faults", "families=[caching]"])
                    ).campaign_spec()
    save_spec(spec)
    optuna.create_study(study_name="faults:caching", storage=storage_for(spec), directions=["minimize", "maximize"])
    return spec


def test_an_unbounded_lease_is_refused_and_an_old_one_counts_as_expired(asked_campaign, capsys, tmp_path):
    spec = asked_campaign
    for lease in ("inf", "1e300", "nan", "0"):
        assert main(["ask", "faults", "--results-dir", str(tmp_path), "--family", "caching", "--lease-s", lease]) == 2
        assert "--lease-s must be a number of seconds in (0, 2592000]" in _one_error_line(capsys)
    storage = storage_for(spec)
    study = optuna.load_study(study_name="faults:caching", storage=storage)
    assert not study.trials  # refused before a trial was created
    # a journal an older vidtune left with a 1e300 lease: the lease counts as expired; a resume takes it over
    trial = study.ask()
    trial.set_user_attr("lease_until", 1e300)
    assert live_lease(study.trials[0].user_attrs) is None
    assert live_lease({"lease_until": time.time() + 60}) is not None
    from vidtune.driver import Campaign

    lines = []
    Campaign(spec, log=lines.append)._requeue_interrupted(study, "caching", storage)  # (raised OverflowError before)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL and study.trials[0].user_attrs["reason"] == "interrupted"


def _ok_result(ms: float = 10.0) -> dict:
    return {"status": "ok", "total_ms": ms, "quality": {"psnr_db": 40.0, "ssim": 0.99, "audio_snr_db": 30.0}}


def test_tell_refuses_a_trial_a_driver_is_measuring_and_the_driver_survives_an_outside_tell(asked_campaign, tmp_path,
                                                                                           capsys):
    spec = asked_campaign
    study = optuna.load_study(study_name="faults:caching", storage=storage_for(spec))
    trial = study.ask()
    trial.suggest_categorical("caching.step_skip.use", [True, False])
    trial.set_user_attr("lease_owner", "gpu-host:/results/faults")
    trial.set_user_attr("lease_pid", 4242)
    trial.set_user_attr("lease_until", time.time() + 120)
    result = tmp_path / "ok.json"
    result.write_text(json.dumps(_ok_result()))
    assert main(["tell", "faults", "--results-dir", str(tmp_path), "--trial", str(trial.number), "--result", str(result)]) == 2
    err = _one_error_line(capsys)
    assert "gpu-host:/results/faults" in err and "4242" in err
    # a lease that expired (the driver died): the agent may tell it...
    trial.set_user_attr("lease_until", time.time() - 1)
    tell_trial(spec, trial.number, _ok_result(11.0))
    # ... and a driver that was still measuring it tells its own result afterwards: kept, as a new trial
    tell_result(spec, study, trial, "caching", _ok_result(9.0))
    trials = optuna.load_study(study_name="faults:caching", storage=storage_for(spec)).trials
    assert [t.values[0] for t in trials] == [11.0, 9.0] and trials[1].user_attrs["measured_for"] == trial.number
    records = RecordLog(spec.directory / "trials.jsonl").read()
    assert [(r["trial"], r.get("measured_for")) for r in records] == [(0, None), (1, 0)]


def test_tell_refuses_non_finite_optional_quality_fields(asked_campaign, tmp_path, capsys):
    ask = ask_trial(asked_campaign, "caching", 60)
    result = tmp_path / "r.json"
    result.write_text('{"status": "ok", "total_ms": 5, "quality": {"psnr_db": 40, "ssim": 0.9, "audio_snr_db": 9, '
                      '"flip": NaN}}')
    assert main(["tell", "faults", "--results-dir", str(tmp_path), "--trial", str(ask["trial"]), "--result", str(result)]) == 2
    assert "quality.flip must be a finite number or null" in _one_error_line(capsys)


# ---------------------------------------------------------------------- config files from users
def test_a_yaml_alias_bomb_is_refused_in_a_short_message(tmp_path, capsys):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    bomb = tmp_path / "tuned.yaml"
    bomb.write_text("vidtune_tuned_config: 1\nknobs: {}\n" + "\n".join(levels) + "\nrequest: *a8\n")
    assert bomb.stat().st_size < 1500
    assert main(["generate", "model=tiny", f"results_dir={tmp_path}", "--config", str(bomb)]) == 2
    err = _one_error_line(capsys)
    assert "aliases" in err and len(err) < 1000  # (before: a 312 MB message)
    # fewer aliases that still expand past any use
    deep = tmp_path / "deep.yaml"
    deep.write_text("a0: &a0 [" + ", ".join(["x"] * 60) + "]\n" + "\n".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 12) + "]" for i in range(1, 5)) + "\n")
    with pytest.raises(ValueError, match="expands to more than"):
        load_user_yaml(deep, "--config")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * (2 << 20))
    with pytest.raises(ValueError, match="over the limit"):
        load_user_yaml(big, "--config")


def test_a_request_of_the_wrong_type_is_refused_before_it_is_printed(tmp_path, capsys):
    config = tmp_path / "tuned.yaml"
    config.write_text(yaml.safe_dump({"vidtune_tuned_config": 1, "knobs": {}, "model": {"preset": "tiny"},
                                      "request": {"prompt": {"nested": ["x"] * 50}}}))
    assert main(["generate", "model=tiny", f"results_dir={tmp_path}", "--config", str(config)]) == 2
    assert "field request must map request fields to numbers or strings" in _one_error_line(capsys)


# ---------------------------------------------------------------------- storage and files
def test_storage_and_file_errors_are_one_line(asked_campaign, tmp_path, capsys):
    spec = asked_campaign
    args = ["--results-dir", str(tmp_path)]
    # a garbled journal record in the middle
    journal = spec.directory / "optuna.journal"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("{garbled\n" + "".join(lines))
    assert main(["ask", "faults", *args, "--family", "caching"]) == 2
    assert "line 1 of" in _one_error_line(capsys)
    journal.write_text("".join(lines))
    # report before the campaign finished (tuned.yaml missing)
    (spec.directory / "campaign.json").write_text("{}")
    assert main(["report", "faults", *args]) == 2
    assert "no tuned.yaml" in _one_error_line(capsys)
    # an empty tuned.yaml (what a kill mid-write left before writes were atomic): signoff says so (was a TypeError)
    (spec.directory / "tuned.yaml").write_text("")
    assert main(["signoff", "faults", *args, "--by", "me", "--verdict", "approve"]) == 2
    assert "not a vidtune tuned config" in _one_error_line(capsys)
    # a corrupt spec
    (spec.directory / "campaign_spec.json").write_text('{"name": "faults", ')
    assert main(["ask", "faults", *args, "--family", "caching"]) == 2
    assert "campaign_spec.json: cannot be read as a campaign spec" in _one_error_line(capsys)
    with pytest.raises(StorageError):
        load_spec(spec.directory)


def test_database_urls_reach_the_user_as_one_line():
    from vidtune.search.storage import rdb_url

    pytest.importorskip("psycopg2")
    import importlib.util

    if importlib.util.find_spec("psycopg") is None:  # what the [postgres] extra installs: the README's URL works
        assert rdb_url("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert rdb_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    with pytest.raises(StorageError, match=r"postgresql://vidtune:\*\*\*@127.0.0.1:1/db: cannot open") as exc:
        rdb_storage("postgresql://vidtune:secret@127.0.0.1:1/db")  # nothing listens on port 1
    assert "secret" not in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(StorageError, match="cannot open the study storage"):
        rdb_storage("sqlite:////nonexistent-folder/sub/x.db")
    with pytest.raises(StorageError, match="driver is not installed"):
        rdb_storage("postgresql+pg8000://u@h/db")  # (a driver not installed)


def test_memory_a_failed_run_leaves_held_is_found_and_its_garbage_is_not_counted():
    """``release_after_failure`` (a worker's check after a failed evaluation): garbage the run left in reference
    cycles is collected and not counted; what stays referenced above the slack is reported, so that the driver
    replaces the process; without a measure (a CPU) nothing is reported."""
    import gc
    import weakref

    import torch

    from vidtune.search.gpu_memory import release_after_failure

    alive: weakref.WeakSet = weakref.WeakSet()

    def tensor(n: int) -> torch.Tensor:
        t = torch.zeros(n, dtype=torch.uint8)
        alive.add(t)
        return t

    def measure(_device) -> int:
        return sum(t.numel() for t in alive)

    gc_was = gc.isenabled()
    gc.disable()  # (the cycle must wait for the check's own collection)
    try:
        before = measure(None)
        cycle: dict = {"t": tensor(1 << 20)}
        cycle["self"] = cycle
        del cycle
        assert measure(None) - before == 1 << 20
        assert release_after_failure("cpu", before, measure, slack=1024) is None
        kept = tensor(1 << 20)
        why = release_after_failure("cpu", before, measure, slack=1024)
        assert why is not None and "GiB stayed held after the failure" in why, why
        assert release_after_failure("cpu", None, measure, slack=1024) is None
        del kept
    finally:
        if gc_was:
            gc.enable()


def test_what_a_technique_keeps_between_runs_is_freed_before_a_setting_without_it():
    """Captured CUDA graphs outlive their setting (re-applying replays them); ``before_run`` (a worker, before each
    setting) frees them before a setting that does not hold the technique, and keeps them for one that does;
    ``release_after_failure`` frees them whatever the setting was."""
    import torch

    from vidtune.search.gpu_memory import before_run, release_after_failure
    from vidtune.techniques.kernel_choice import cuda_graphs
    from vidtune.techniques.setting import Setting

    blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    cuda_graphs._RUNNERS[blocks] = ["captured graphs"]
    with_graphs = Setting.of({"kernel_choice.cuda_graphs": {"enabled": True}, "caching.step_skip": {"every": 2}})
    assert before_run("cpu", with_graphs) is None  # (nothing measured on a CPU)
    assert blocks in cuda_graphs._RUNNERS
    before_run("cpu", Setting.of({"caching.step_skip": {"every": 2}}))
    assert blocks not in cuda_graphs._RUNNERS
    cuda_graphs._RUNNERS[blocks] = ["captured graphs"]
    release_after_failure("cpu", 0, measure=lambda _d: 0)
    assert blocks not in cuda_graphs._RUNNERS
