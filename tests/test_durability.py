"""Nothing lost: a journal a crash tore, read again with every finished trial kept (real Optuna journals)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import optuna
import torch
import pytest

from processes import kill_tagged, tagged_pids
from vidtune.cli import Settings, load_config
from vidtune.search.campaign import StorageError, repair_journal, storage_for


# a small request for the campaigns run in a process of their own (a generation of tiny takes ~0.1 s there)
SMALL = ["request.height=128", "request.width=192", "request.frames=9"]


def _spec(tmp_path: Path):
    return Settings(load_config([f"results_dir={tmp_path / 'results'}", "model=tiny", "name=torn"])).campaign_spec()


def _three_trials(spec) -> Path:
    study = optuna.create_study(study_name="torn:caching", storage=storage_for(spec), directions=["minimize", "maximize"])
    for i in range(3):
        trial = study.ask()
        trial.suggest_float("x", 0, 1)
        study.tell(trial, [100.0 + i, 40.0])
    return spec.directory / "optuna.journal"


def test_a_torn_last_record_is_cut_back_and_the_trials_kept(tmp_path):
    spec = _spec(tmp_path)
    path = _three_trials(spec)
    whole = path.read_bytes()
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    path.write_bytes(whole + last[: len(last) // 2])  # a crash mid-append: half a record, no newline
    torn = path.read_bytes()
    # as it was before the repair (on a copy): the next record lands after the torn bytes, and from then
    # on Optuna cannot read the journal at all
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    copy = tmp_path / "copy.journal"
    copy.write_bytes(torn)

    def go_on_without_repair() -> None:
        bare = optuna.load_study(study_name="torn:caching", storage=JournalStorage(JournalFileBackend(str(copy))))
        bare.tell(bare.ask(), [1.0, 1.0])  # (Optuna 5.0: fails here, in its replay of the torn record)
        optuna.load_study(study_name="torn:caching", storage=JournalStorage(JournalFileBackend(str(copy)))).get_trials()

    with pytest.raises((ValueError, AttributeError)):
        go_on_without_repair()
    said: list[str] = []
    study = optuna.load_study(study_name="torn:caching", storage=storage_for(spec, said.append))
    assert [t.values for t in study.get_trials()] == [[100.0, 40.0], [101.0, 40.0], [102.0, 40.0]]
    assert len(said) == 1 and "torn last record" in said[0] and str(path) in said[0]
    backups = list(path.parent.glob("optuna.journal.torn-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == torn and path.read_bytes() == whole
    # the campaign goes on: a new trial lands after the last complete record and reads back
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    study.tell(trial, [103.0, 40.0])
    again = optuna.load_study(study_name="torn:caching", storage=storage_for(spec, said.append))
    assert len(again.get_trials()) == 4 and len(said) == 1  # nothing more to repair


def test_damage_before_the_last_record_names_the_file_and_line(tmp_path):
    spec = _spec(tmp_path)
    path = _three_trials(spec)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:10]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(StorageError, match=r"optuna.journal: line 3 of \d+ is not a journal record.*backup"):
        storage_for(spec)
    assert repair_journal(tmp_path / "missing.journal") is None


def test_a_second_campaign_on_the_same_name_is_refused_while_the_first_lives(tmp_path, capsys):
    import signal
    import subprocess
    import sys
    import time

    from vidtune.cli import main
    from vidtune.search.campaign import CampaignBusy, campaign_lock
    from vidtune.search.storage import campaign_running

    directory = tmp_path / "results" / "c1"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from vidtune.search.campaign import campaign_lock\n"
        f"with campaign_lock(Path({str(directory)!r})):\n    print('held', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        # the whole CLI: refused with status 2, saying who holds it, before a model is built or a file written
        assert main(["campaign", "model=tiny", f"results_dir={tmp_path / 'results'}", "name=c1"]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid} on " in err and "is running already" in err and "campaign.lock" in err
        assert sorted(p.name for p in directory.iterdir()) == ["campaign.lock"]
        assert campaign_running(directory)  # (what `vidtune mcp`'s campaign_status reads)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not campaign_running(directory)  # (the file still names the killed pid)
    # killed, it holds nothing: the next run takes the lock at once (no stale lock to clean)
    start = time.time()
    with campaign_lock(directory):
        assert campaign_running(directory)
        with pytest.raises(CampaignBusy):
            with campaign_lock(directory):
                pass
    assert time.time() - start < 5 and not campaign_running(directory)  # (ended: the lock file emptied)


def _hand_tuned(tmp_path: Path, **request) -> Path:
    """A tuned config written by hand for the tiny preset and the default request (as an export writes it)."""
    import yaml

    from vidtune.integrator.tuned import FORMAT_VERSION

    settings = Settings(load_config(["model=tiny"]))
    doc = {"vidtune_tuned_config": FORMAT_VERSION, "campaign": "by-hand",
           "knobs": {"kernel_choice.sdpa_backend": {"video_self": "math"}}, "model": settings.source.identity(),
           "request": {**settings.request.to_dict(), **request},
           "signoff": {"by": None, "verdict": None, "note": None, "at": None}}
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_tuned_configs_are_checked_where_applied(tmp_path, capsys):
    import json

    from vidtune.cli import main
    from vidtune.integrator.tuned import TunedConfigError, load_tuned_config, sign_off

    tuned = _hand_tuned(tmp_path)
    common = ["model=tiny", f"results_dir={tmp_path / 'results'}", f"out={tmp_path / 'gen'}"]
    # unsigned, same request: it runs, with a visible note that is also in the summary
    assert main(["generate", *common, "--config", str(tuned)]) == 0
    captured = capsys.readouterr()
    assert "vidtune: note:" in captured.err and "not signed off" in captured.err
    assert any("not signed off" in n for n in json.loads(captured.out)["config_notes"])
    # another request (before this check: exit 0, the stored request ignored): refused by field, before any model
    assert main(["generate", *common, "request.seed=5", "request.height=512", "--config", str(tuned)]) == 2
    err = capsys.readouterr().err
    assert "field request" in err and "seed tuned 0, asked 5" in err
    assert "height tuned 256, asked 512" in err and "--any-request" in err
    assert not (tmp_path / "results" / "default" / "baseline").exists()
    # ... unless asked for, and then noted
    assert main(["generate", *common, "request.seed=5", "--any-request", "--config", str(tuned)]) == 0
    assert any("not tuned for" in n and "seed" in n for n in json.loads(capsys.readouterr().out)["config_notes"])
    # a config its reviewer rejected runs only with --allow-rejected
    sign_off(tuned, by="qa", verdict="reject", note="flicker at the seams")
    assert main(["generate", *common, "--config", str(tuned)]) == 2
    assert "verdict: reject by qa (flicker at the seams)" in capsys.readouterr().err
    with pytest.raises(TunedConfigError, match="--allow-rejected"):
        load_tuned_config(tuned)
    assert "rejected it" in load_tuned_config(tuned, allow_rejected=True)["notes"][0]


@pytest.mark.parametrize("override, field", [
    ("name=../escape", "name must be one folder name inside results_dir"),
    ("name=a/b", "name must be one folder name"),
    ("request.seed=100000000000000000000000", r"request.seed must be an integer in \[0, 2\*\*63 - 1\]"),
    ("budget.trial_timeout_s=-5", "budget.trial_timeout_s must be a number of seconds > 0"),
    ("ray.num_actors=-1", "ray.num_actors must be an integer >= 0"),
])
def test_bad_values_are_refused_by_field_before_any_work(tmp_path, capsys, override, field):
    import re

    from vidtune.cli import main

    assert main(["campaign", "model=tiny", f"results_dir={tmp_path / 'results'}", override]) == 2
    assert re.search(field, capsys.readouterr().err)
    assert not (tmp_path / "escape").exists() and not list(tmp_path.glob("results/*/baseline"))


def test_an_unwritable_results_dir_is_refused_before_the_model(tmp_path, capsys):
    from vidtune.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["generate", "model=tiny", f"results_dir={blocker}"]) == 2  # (before: NotADirectoryError)
    assert "results_dir: cannot write" in capsys.readouterr().err
    # (/proc refuses a new folder to root too, where a read-only mode would not)
    assert main(["generate", "model=tiny", "out=/proc/vidtune-gen", f"results_dir={tmp_path / 'r'}"]) == 2
    assert "out: cannot write /proc/vidtune-gen" in capsys.readouterr().err


def test_the_largest_seed_runs(tiny_models, tiny_request):
    from dataclasses import replace

    from vidtune.model import ReferencePipeline

    out = ReferencePipeline(tiny_models).run(replace(tiny_request, seed=2**63 - 1))
    assert out.frames.shape[0] == tiny_request.frames


def test_a_damaged_stored_baseline_is_computed_again(tmp_path, tiny_models, tiny_request):
    import json

    from vidtune.model import ModelSource, ReferencePipeline
    from vidtune.search.evaluator import ensure_baseline

    pipe = ReferencePipeline(tiny_models)
    source = ModelSource(preset="tiny")
    base, reused = ensure_baseline(pipe, tiny_request, source, tmp_path / "b", repeats=1, warmup=0)
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert not reused and set(meta["files"]) == {"output.safetensors", "stages.safetensors"} and "noise_floor" in meta
    assert ensure_baseline(pipe, tiny_request, source, tmp_path / "b", repeats=1, warmup=0)[1]  # whole: reused
    raw = tmp_path / "b" / "output.safetensors"
    raw.write_bytes(raw.read_bytes()[:-100])  # truncated (before: reused by its key, then a crash)
    with pytest.warns(UserWarning, match="output.safetensors has .* bytes, .* were stored; computing the baseline again"):
        again, reused = ensure_baseline(pipe, tiny_request, source, tmp_path / "b", repeats=1, warmup=0)
    assert not reused and raw.stat().st_size == meta["files"]["output.safetensors"]["bytes"]
    assert torch.equal(again.frames, base.frames)
    # the same size, other bytes: the digest tells
    data = bytearray(raw.read_bytes())
    data[-1] ^= 0xFF
    raw.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="does not match the sha256"):
        assert not ensure_baseline(pipe, tiny_request, source, tmp_path / "b", repeats=1, warmup=0)[1]


def test_a_garbage_checkpoint_is_refused_by_field_before_the_model(tmp_path, capsys):
    from safetensors.torch import save_file

    from vidtune.cli import main

    upsampler = tmp_path / "up.safetensors"
    save_file({"w": torch.zeros(2)}, str(upsampler))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01 not safetensors" * 64)
    no_config = tmp_path / "no_config.safetensors"
    save_file({"model.diffusion_model.x": torch.zeros(2)}, str(no_config))
    for path, said in ((garbage, "is not a readable safetensors file"), (no_config, "has no LTX-2 'config' metadata"),
                       (upsampler, "has no LTX-2 'config' metadata")):
        args = ["generate", "model=checkpoint", f"model.checkpoint={path}", f"model.upsampler={upsampler}",
                f"results_dir={tmp_path / 'r'}"]
        assert main(args) == 2  # (before: safetensors' raw SafetensorError from inside the loader)
        err = capsys.readouterr().err
        assert "model.checkpoint=" in err and said in err
    assert not (tmp_path / "r").exists()


def test_a_resumed_campaign_leaves_a_live_lease_alone(tmp_path):
    import time

    from vidtune.driver import Campaign
    from vidtune.search.campaign import ask_trial

    spec = Settings(load_config([f"results_dir={tmp_path / 'results'}", "model=tiny", "name=lease",
                                 "families=[caching]"])).campaign_spec()
    lines: list[str] = []
    campaign = Campaign(spec, log=lines.append)
    campaign._studies()
    asked = ask_trial(spec, "caching", lease_s=600)
    study = campaign._studies()["caching"]  # a resume while the agent measures (before: marked interrupted)
    trial = study.get_trials(deepcopy=False)[asked["trial"]]
    assert trial.state == optuna.trial.TrialState.RUNNING and any("leased to an agent" in line for line in lines)
    # once the lease has run out, the trial is the campaign's again: interrupted, re-queued with its setting
    study._storage.set_trial_user_attr(trial._trial_id, "lease_until", time.time() - 1)
    study = campaign._studies()["caching"]
    trials = study.get_trials(deepcopy=False)
    assert trials[asked["trial"]].state == optuna.trial.TrialState.FAIL
    requeued = [t for t in trials if t.state == optuna.trial.TrialState.WAITING and "requeued_from" in t.user_attrs]
    assert [t.user_attrs["requeued_from"] for t in requeued] == [asked["trial"]]
    # the agent's trial was the first probe: queued again as that probe, which the follow-ups then wait for
    assert requeued[0].user_attrs["probe"] == trials[asked["trial"]].user_attrs["probe"] == "caching.first_block"


def _listening(pids: list[int]) -> list[str]:
    """Local addresses of the TCP sockets ``pids`` listen on (from /proc/net/tcp{,6})."""
    import os

    owned = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    owned.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in owned:  # state LISTEN
                found.append(cols[1].split(":")[0])
    return found


@contextmanager
def _running_campaign(tmp_path: Path):
    """A tiny campaign in its own process, a trial in, with a tag in its environment (its Ray and its
    actors inherit it); yields (process, tag, stderr file) and kills whatever is left at the end."""
    import os
    import subprocess
    import sys
    import time
    import uuid

    tag = f"VIDTUNE_CAMPAIGN_TEST={uuid.uuid4().hex}"
    env = {**os.environ, tag.split("=")[0]: tag.split("=")[1]}
    log = tmp_path / "campaign.err"
    cmd = [sys.executable, "-m", "vidtune.cli", "campaign", "model=tiny", f"results_dir={tmp_path / 'results'}",
           "name=sig", "families=[caching]", "budget.trials_per_family=200", "eval.repeats=1", "eval.warmup=0",
           "eval.paired=false", *SMALL]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.time() + 240
        while "caching 1/200" not in log.read_text() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None and "caching 1/200" in log.read_text(), log.read_text()[-2000:]
        assert len(tagged_pids(tag)) > 1  # the driver and, at least, its Ray and an actor
        yield proc, tag, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_tagged(tag)


def test_running_trials_are_leased_and_the_lease_renewed_while_they_run(tmp_path, monkeypatch):
    """Each trial the driver measures carries its lease (owner, until), renewed by the dispatch loop's
    heartbeat; a resume takes over a trial leased to this very campaign (its driver is dead: the campaign
    lock says so) but leaves one leased to another host's driver alone."""
    import time

    from vidtune import driver
    from vidtune.driver import Campaign

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setattr(driver, "HEARTBEAT_S", 0.05)
    # every trial waits 3 s without using the CPU (a long trial; it used to be 6 generations at the default size)
    monkeypatch.setenv("VIDTUNE_FAULT_INJECT", "slow:3")
    spec = Settings(load_config([f"results_dir={tmp_path / 'results'}", "model=tiny", *SMALL, "name=beat",
                                 "families=[tiling]", "budget.trials_per_family=2", "eval.repeats=1", "eval.warmup=0",
                                 "eval.paired=false", "integrator.final_repeats=1", "integrator.max_p_value=1"])).campaign_spec()
    campaign = Campaign(spec, log=lambda *_: None)
    campaign.run()
    study = campaign._studies()["tiling"]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(t.user_attrs["lease_owner"] == campaign.owner for t in done)
    # renewed while it ran: the last lease was set after the trial's start, by more than the first's slack
    long = [t for t in done if (t.datetime_complete - t.datetime_start).total_seconds() > 2.0]
    assert long and all(t.user_attrs["lease_until"] - driver.LEASE_S > t.datetime_start.timestamp() + 0.5 for t in long)

    # two running trials with live leases: this campaign's own (its driver was killed) and another host's
    mine, theirs = study.ask(), study.ask()
    for t, owner in ((mine, campaign.owner), (theirs, "other-host:/results/beat")):
        t.suggest_categorical("tiling.vae_tiles.use", [False, True])
        t.set_user_attr("lease_owner", owner)
        t.set_user_attr("lease_until", time.time() + 600)
    trials = campaign._studies()["tiling"].get_trials(deepcopy=False)
    assert trials[mine.number].user_attrs.get("reason") == "interrupted"
    assert trials[theirs.number].state == optuna.trial.TrialState.RUNNING


def test_a_running_campaign_listens_on_loopback_only_and_sigterm_stops_it_and_its_actors(tmp_path):
    """(One running campaign for both checks: each used to start its own.)"""
    import signal
    import time

    signame = "SIGTERM"  # (SIGINT takes the same handler: test_sigint_asks_the_same_stop, without a campaign)

    with _running_campaign(tmp_path) as (proc, tag, log):
        addresses = _listening(tagged_pids(tag))
        # 127.0.0.1, ::1 or ::ffff:127.0.0.1 (before the fix: [::] and the node's address, Ray's environment
        # variable having been set after Ray was imported)
        loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
        assert addresses and set(addresses) <= loopback, addresses
        proc.send_signal(getattr(signal, signame))
        code = proc.wait(timeout=60)
        said = log.read_text()
        assert code == 128 + getattr(signal, signame), said[-2000:]
        assert f"vidtune: stopped by {signame}" in said and "Traceback" not in said
        deadline = time.time() + 5  # Ray's processes and the actors end within a few seconds of the driver
        while tagged_pids(tag) and time.time() < deadline:
            time.sleep(0.2)
        assert not tagged_pids(tag)


def test_sigint_asks_the_same_stop():
    import os
    import signal

    from vidtune.search.campaign import CampaignStopped, StopOnSignals, check_stop

    before = signal.getsignal(signal.SIGINT)
    with StopOnSignals():
        check_stop()  # nothing asked yet
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal while stopping changes nothing
        with pytest.raises(CampaignStopped, match="stopped by SIGINT") as stopped:
            check_stop()
        assert stopped.value.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before
    check_stop()  # cleared on the way out
