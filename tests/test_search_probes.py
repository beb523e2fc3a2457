"""A family study's first probes (search/probes.py): each technique alone at its knobs' fast end, backed off to
halfway when it fails the quality gate, then the passing ones combined fastest first."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from vidtune.model import GenerationRequest
from vidtune.search.probes import COMBINED, PROBE, probe_params, queue_follow_ups, queue_probes
from vidtune.search.sampling import ask_effective, sample_family_setting, set_constraints
from vidtune.techniques import KnobError
from vidtune.techniques.knobs import Knob

REQ = GenerationRequest(height=128, width=192, frames=9)


def test_a_probe_sets_the_technique_alone_at_the_fast_end_and_halfway_backs_off():
    full = probe_params("caching", "caching.teacache", REQ)
    assert full["caching.teacache.use"] is True
    assert all(v is False for k, v in full.items() if k.endswith(".use") and k != "caching.teacache.use")
    assert full["caching.teacache.threshold"] == 2.0 and full["caching.teacache.first_kept"] == 0
    half = probe_params("caching", "caching.teacache", REQ, level=0.5)
    assert half["caching.teacache.threshold"] == 1.0 and 0 < half["caching.teacache.first_kept"] < 8
    # step skip's `every` is sampled from 1 (its switch): the fast end is 1, halfway lies inside
    skip = probe_params("caching", "caching.step_skip", REQ)
    assert skip["caching.step_skip.every"] == 1 and skip["caching.step_skip.first_kept"] == 1
    assert skip["caching.step_skip.stage"] in ("stage1", "stage2", "both")  # no direction known: drawn
    assert 1 < probe_params("caching", "caching.step_skip", REQ, level=0.5)["caching.step_skip.every"] < 4
    # an ordered categorical: Sol's beta at its largest, halfway in the middle of the non-off choices
    assert probe_params("sparse_attention", "sparse_attention.sol", REQ)["sparse_attention.sol.beta"] == 3.0
    assert probe_params("sparse_attention", "sparse_attention.sol", REQ, level=0.5)["sparse_attention.sol.beta"] == 1.25
    # no directional knob, or nothing the probe could change: no probe
    assert probe_params("caching", "caching.stg_prefix", REQ) is None
    assert probe_params("kernel_choice", "kernel_choice.compile", REQ) is None
    # the parameters are the family's own: its sampling builds the technique alone from them (the rest drawn)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.enqueue_trial(full)
    assert set(sample_family_setting(study.ask(), "caching", REQ)) == {"caching.teacache"}


def test_a_knobs_fast_end_is_checked_where_it_is_declared():
    with pytest.raises(KnobError, match="fast must be 'low' or 'high'"):
        Knob("k", "int", off=0, low=0, high=3, fast="up")
    with pytest.raises(KnobError, match=r"k.fast must be one of \['a', 'b'\]"):
        Knob("k", "categorical", off="a", choices=("a", "b"), fast="c")
    assert Knob("k", "float", off=0.0, low=0.0, high=1.0, fast="high").domain()["fast"] == "high"


def _measure(study, rule):
    """Ask the next effective trial and tell it as the campaign does: ``rule(setting)`` -> (latency, passes)."""
    trial, setting, _ = ask_effective(study, "caching", REQ)
    latency, passes = rule(setting)
    set_constraints(trial, [-1.0 if passes else 1.0])
    trial.set_user_attr("feasible", passes)
    study.tell(trial, [latency, 40.0])
    return trial, setting


def test_failed_probes_are_backed_off_then_the_passing_ones_combined_fastest_first():
    def rule(setting):  # teacache at its fast end breaks the gate; step skip is the fastest pass
        tea = setting.get("caching.teacache", {})
        passes = tea.get("threshold", 0) <= 1.5
        latency = 100.0 - 30 * ("caching.step_skip" in setting) - 20 * bool(tea) - 5 * ("caching.first_block" in setting)
        return latency, passes

    study = optuna.create_study(directions=["minimize", "maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    probed = queue_probes(study, "caching", REQ)
    # (the guidance cache acts on multistep requests only; the STG prefix has no directional knob)
    assert probed == ["caching.first_block", "caching.step_skip", "caching.teacache"]
    labels = []
    while True:
        queue_follow_ups(study, "caching", REQ)
        trial, setting = _measure(study, rule)
        label = trial.user_attrs.get(PROBE)
        if label is None:
            break
        labels.append(label)
        if label == COMBINED:
            combined = setting
    # every probe once, teacache again halfway (it failed), then the combination; then the sampler's own
    assert labels[:len(probed)] == probed and labels[len(probed)] == "caching.teacache@half" and labels[-1] == COMBINED
    assert len(labels) == len(probed) + 2 == 5
    # fastest first: step skip (70), teacache halfway (80), first block (95) clashes with teacache: left out
    assert study.user_attrs[COMBINED] == ["caching.step_skip", "caching.teacache"]
    assert set(combined) == {"caching.step_skip", "caching.teacache"}
    assert combined["caching.teacache"]["threshold"] == 1.0 and combined["caching.step_skip"]["every"] == 1
    # looked at once: nothing more is queued, however often asked
    assert queue_follow_ups(study, "caching", REQ) == [] and not study.get_trials(states=(TrialState.WAITING,))


def test_follow_ups_wait_for_the_probes_in_flight():
    study = optuna.create_study(directions=["minimize", "maximize"])
    queue_probes(study, "caching", REQ)
    first = study.ask()  # a probe running on some actor
    sample_family_setting(first, "caching", REQ)
    assert first.user_attrs[PROBE] and queue_follow_ups(study, "caching", REQ) == []
    while study.get_trials(states=(TrialState.WAITING,)):  # the others measured, all failing the gate
        _measure(study, lambda setting: (50.0, False))
    assert queue_follow_ups(study, "caching", REQ) == []  # the first still runs: nothing backed off yet
    set_constraints(first, [1.0])
    first.set_user_attr("feasible", False)
    study.tell(first, [50.0, 40.0])
    probed = sorted(f"{t.user_attrs[PROBE]}@half" for t in study.trials if t.user_attrs.get(PROBE))
    assert sorted(queue_follow_ups(study, "caching", REQ)) == probed and len(probed) == 3
