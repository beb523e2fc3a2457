"""Where a search starts: the shipped catalogue of starting points per GPU class and mode, and the settings known
to lose there (``search/catalogue.yaml``).

A campaign queues the catalogue's points first in each new family study (each family its part of a point, as
for ``seed_configs``), exact points before near-exact (FP8) ones before approximate ones, so that its first
trials are what an expert would try instead of TPE's random start-up draws. A sample holding a setting the
catalogue lists as a loser on this GPU class is not measured (pruned with the reason).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting, SettingLike

__all__ = ["GpuClass", "Exactness", "StartingPoint", "Avoid", "gpu_class", "starting_points", "avoided", "load"]


class GpuClass(str, enum.Enum):
    """GPU generations whose kernels and trade-offs differ (a catalogue entry applies to one, or to any)."""

    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    ADA = "ada"
    AMPERE = "ampere"
    OTHER_GPU = "other-gpu"
    CPU = "cpu"


class Exactness(int, enum.Enum):
    """How far a setting is meant to move the output; the queue order (exact first)."""

    EXACT = 0  # kernel, compile and tiling choices: no approximation intended (floating-point order may change)
    NEAR = 1  # lower-precision arithmetic (FP8)
    APPROXIMATE = 2  # caching, sparsity


_NAMES = (("H100", GpuClass.HOPPER), ("H200", GpuClass.HOPPER), ("H800", GpuClass.HOPPER), ("GH200", GpuClass.HOPPER),
          ("B200", GpuClass.BLACKWELL), ("B100", GpuClass.BLACKWELL), ("GB200", GpuClass.BLACKWELL),
          ("L40", GpuClass.ADA), ("L4", GpuClass.ADA), ("RTX 40", GpuClass.ADA), ("A100", GpuClass.AMPERE),
          ("A10", GpuClass.AMPERE), ("A40", GpuClass.AMPERE), ("RTX 30", GpuClass.AMPERE))


def gpu_class(device_name: str | None) -> GpuClass:
    """The class of a device from its name (``torch.cuda.get_device_name``; None, ``cpu`` or what a baseline's
    environment records for one, ``cpu (x86_64)``: the CPU)."""
    if not device_name or device_name.lower().split(" (")[0] == "cpu":
        return GpuClass.CPU
    for needle, cls in _NAMES:
        if needle in device_name:
            return cls
    return GpuClass.OTHER_GPU


@dataclass(frozen=True)
class StartingPoint:
    """One catalogue entry: a setting worth measuring first on ``gpu`` for ``mode``."""

    name: str
    gpu: str  # a GpuClass value or "any"
    mode: str  # distilled, multistep or any
    kind: Exactness
    knobs: Setting = field(hash=False)
    measured: str = ""  # where its number comes from

    def matches(self, cls: GpuClass, mode: str) -> bool:
        return self.gpu in ("any", cls.value) and self.mode in ("any", mode)


@dataclass(frozen=True)
class Avoid:
    """A knob value known to lose on ``gpu``: ``in`` a list, or ``below``/``above`` a bound."""

    gpu: str
    device: str  # cuda or any: where the loss was measured
    technique: str
    knob: str
    values: tuple[Any, ...] = ()
    below: float | None = None
    above: float | None = None
    why: str = ""

    def matches(self, cls: GpuClass) -> bool:
        on_gpu = cls is not GpuClass.CPU
        return self.gpu in ("any", cls.value) and (self.device == "any" or on_gpu)

    def holds(self, values: dict[str, Any]) -> bool:
        """Whether a technique's (full) values hold the losing knob value."""
        if self.knob not in values:
            return False
        v = values[self.knob]
        if self.values and v in self.values:
            return True
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        return number and ((self.below is not None and v < self.below) or (self.above is not None and v > self.above))


def load(text: str | None = None) -> tuple[list[StartingPoint], list[Avoid]]:
    """The catalogue (the shipped file, or ``text``), validated against the registry: a point or an avoid
    naming a technique or knob that does not exist, or a value out of its domain, raises ``ValueError``."""
    from vidtune.techniques import get, resolve_values

    if text is None:
        text = resources.files("vidtune.search").joinpath("catalogue.yaml").read_text()
    doc = yaml.safe_load(text) or {}
    points = []
    for raw in doc.get("points") or []:
        try:
            kind = Exactness[str(raw["kind"]).upper()]
            knobs = resolve_values(raw["knobs"])  # (names and values checked by the registry)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"catalogue point {raw.get('name')!r}: {exc}") from None
        if raw.get("mode", "any") not in ("any", "distilled", "multistep"):
            raise ValueError(f"catalogue point {raw.get('name')!r}: mode must be any, distilled or multistep")
        points.append(StartingPoint(str(raw["name"]), str(raw.get("gpu", "any")), str(raw.get("mode", "any")), kind,
                                    knobs, str(raw.get("measured", ""))))
    avoids = []
    for raw in doc.get("avoid") or []:
        tech = get(str(raw["technique"]))
        tech.knob(str(raw["knob"]))  # raises for an unknown knob
        avoids.append(Avoid(str(raw.get("gpu", "any")), str(raw.get("device", "any")), tech.name, str(raw["knob"]),
                            tuple(raw.get("in") or ()), raw.get("below"), raw.get("above"), str(raw.get("why", ""))))
    return points, avoids


def starting_points(cls: GpuClass, mode: str, text: str | None = None) -> list[StartingPoint]:
    """The catalogue's points for a GPU class and mode, exact first (then the file's order)."""
    points, _ = load(text)
    return sorted((p for p in points if p.matches(cls, mode)), key=lambda p: p.kind)


def avoided(setting: SettingLike, cls: GpuClass, text: str | None = None) -> Avoid | None:
    """The first catalogue loser ``setting`` holds on this GPU class (None: none)."""
    from vidtune.techniques import get

    _, avoids = load(text)
    for rule in avoids:
        if rule.matches(cls) and rule.technique in setting:
            if rule.holds(get(rule.technique).validate(setting[rule.technique])):
                return rule
    return None
