"""The search-efficiency benchmark (benchmarks/search_efficiency.py): the campaign's sampling against the exhaustive
set of a small tiny-model space, replayed on a committed table measured on a CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vidtune.benchmarks.search_efficiency import SPACES, enumerate_space, main, score_table, snap

TABLE = Path(__file__).parent / "data" / "search_efficiency_tiny_caching.json"


def test_the_space_is_enumerated_by_the_familys_own_rules_and_snapping_keeps_its_points():
    from vidtune.techniques import get

    space = SPACES["tiny-caching"]
    settings = enumerate_space(space)
    keys = [json.dumps(s, sort_keys=True) for s in settings]
    assert len(set(keys)) == len(keys) > 30
    req = space.generation_request()
    for s in settings:
        assert s and all(get(n).effective(get(n).validate(v), req) for n, v in s.items())
        assert snap(s, space) == s
        assert not ({"caching.first_block", "caching.teacache"} <= set(s))  # two residual caches never together
    # each representative lies in its own bin of the range the family samples
    for name, knobs in space.grid.items():
        for knob, values in knobs.items():
            bins = [space.bin_of(f"{name}.{knob}", v) for v in values]
            assert bins == list(range(len(values))) or set(bins) == {None}, (name, knob, bins)
    # a sampled value is read as its bin's representative; a technique outside the space is dropped
    assert snap({"caching.step_skip": {"every": 4, "first_kept": 7, "last_kept": 3, "stage": "both"},
                 "caching.guidance_cache": {"refresh": 2}}, space) == {
        "caching.step_skip": {"every": 3, "first_kept": 5, "last_kept": 1, "stage": "both"}}


@pytest.mark.parametrize("gate_db", [None, 49.5])
def test_the_campaign_finds_the_best_setting_in_a_quarter_of_the_exhaustive_evaluations(gate_db):
    """The issue's CPU target: within 5% of the exhaustive best in <= 25% of the exhaustive evaluations (median
    over seeded replays). The table's own gate (20 dB: every setting passes; two settings within 5%, so random
    order needs ~a third of them), and a strict one (49.5 dB: the aggressive probes fail and are backed off).
    Before the probes (TPE alone, independent or multivariate) the campaign needed a median of 52 and 29."""
    table = json.loads(TABLE.read_text())
    assert table["model"] == "tiny" and len(table["rows"]) == len(enumerate_space(SPACES["tiny-caching"]))
    if gate_db is not None:
        table["gate"]["psnr_db"] = gate_db
    result = score_table(table, runs=10)
    n = result["settings"]
    assert result["campaign"]["found"] == 10
    assert result["campaign"]["median_evaluations"] <= 0.25 * n, result
    if gate_db is None:  # (under the strict gate a third of the settings are within 5%: random is as quick)
        assert result["campaign"]["median_evaluations"] < result["random"]["median_evaluations"], result


def test_measure_then_score_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "table.json"
    assert main(["measure", "--space", "tiny-smoke", "--repeats", "1", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert len(table["rows"]) == 2 and all(r["status"] == "ok" and r["total_ms"] > 0 and r["seconds"] > 0
                                           for r in table["rows"])
    capsys.readouterr()
    assert main(["score", "--table", str(out), "--runs", "3"]) == 0
    scored = json.loads(capsys.readouterr().out)
    # the command's output, not the campaign's efficiency (the table tests above): on this freshly measured
    # two-setting table noise decides which is best, and where the less aggressive one wins the campaign's TPE
    # (after its probe at the fast end) finds it within the 6 evaluations allowed in ~2 runs of 3 (26 of 40 on
    # an inverted copy, TPE without probes 29 of 40); random order always does
    assert scored["settings"] == 2 and scored["random"]["found"] == 3 and 0 <= scored["campaign"]["found"] <= 3
    assert scored["campaign"]["found"] < 2 or 1 <= scored["campaign"]["median_evaluations"] <= 6  # (a median of 3 runs)
    with pytest.raises(SystemExit):
        main(["score", "--table", str(out), "--within", "2"])
