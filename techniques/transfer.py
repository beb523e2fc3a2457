"""A setting measured on one model and request, mapped to another (the quality model of a campaign on random
weights): the knobs that scale with the depth, the frame's long side or the frame count."""

from __future__ import annotations

import math
from typing import Any, Mapping

from vidtune.techniques.knobs import SCALES, KnobError  # noqa: F401  (SCALES re-exported)
from vidtune.techniques.registry import get
from vidtune.techniques.setting import KnobValues, Setting, SettingLike, resolve_values

__all__ = ["SCALES", "transfer_setting"]




def transfer_setting(values: SettingLike, source: Mapping[str, float],
                     target: Mapping[str, float]) -> tuple[Setting, list[str]]:
    """``values`` measured on one model and request, mapped to another: every knob that ``scales`` with
    the depth (transformer blocks), the frame's long side or the frame count is multiplied by the target's
    over the source's (``source`` / ``target``: ``{"depth": blocks, "size": pixels, "frames": n}``),
    rounded to the knob's grid (categorical: the nearest choice) and kept in its domain and, for a depth,
    within the target's blocks; an off value of zero or below (none, automatic) stays, a positive one (the
    first-block cache's one probe block) is a quantity and maps too, and a count that was above zero stays at least one (three
    of 48 dense blocks map to one of three, not to none). Other knobs are unchanged. Returns the mapped
    values and one line per changed knob ("sol.dense_layers: 12 -> 1 (depth 48 -> 3)"); ``KnobError`` when a
    mapped setting fails its technique's checks.

    Why: quality numbers of a model with random weights mean nothing (FP8 alone scores 33 dB on the random
    19B), so a campaign on it measures quality on a trained model at "the same" setting; for a layer index
    or a latent tile overlap "the same" is the same fraction of the model or the frame. A knob whose effect
    is absolute (VAE tiles in pixels: a seam's cost follows the decoder's receptive field) has no ``scales``.
    """
    out: KnobValues = {}
    notes: list[str] = []
    for name, knob_values in resolve_values(values).items():
        tech = get(name)
        mapped = dict(knob_values)
        for knob in tech.knobs:
            v = knob_values.get(knob.name, knob.off)
            if knob.scales is None or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if v == knob.off and v <= 0:  # none, or automatic (-1): not a quantity. A positive off value is one
                continue  # (when VAE tiles scaled, the official 64 px overlap kept at 64 beside a tile mapped to 64
                # broke the setting on the quality model: a 1536x1024 campaign on the H200 lost a trial to it)
            ratio = float(target[knob.scales]) / float(source[knob.scales])
            want = v * ratio
            if knob.kind == "categorical":
                numeric = [c for c in knob.choices if isinstance(c, (int, float)) and not isinstance(c, bool)
                           and c != knob.off]
                new = min(numeric, key=lambda c: (abs(c - want), c)) if numeric else v
            else:
                low, high = knob.low, knob.high
                if knob.scales == "depth":
                    high = min(high, target["depth"])
                if knob.kind == "int":
                    grid = int(knob.step)
                    new = int(low + math.floor((want - low) / grid + 0.5) * grid)  # (half up, not to even)
                    if v > 0 and new <= 0:
                        new = max(int(low), grid) if low <= 0 else int(low)
                    new = int(min(max(new, low), high))
                    new -= (new - int(low)) % grid
                else:
                    new = float(min(max(want, low), high))
            if new != v:
                mapped[knob.name] = knob.validate(new, prefix=f"{name}.{knob.name}")
                notes.append(f"{name}.{knob.name}: {v} -> {mapped[knob.name]} ({knob.scales} "
                             f"{source[knob.scales]:g} -> {target[knob.scales]:g})")
        try:  # the knobs' own cross-checks (an overlap at most half a tile) on the mapped values
            tech.validate(mapped)
        except KnobError as e:
            raise KnobError(f"{name} mapped from {dict(source)} to {dict(target)} is {mapped}, which is invalid: {e}") from None
        out[name] = mapped
    return Setting(out), notes
