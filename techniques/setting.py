"""A setting: knob values for several techniques, validated once, immutable, passed down as one value.

``Setting`` is what crosses every module boundary where a setting goes (the sampler, the evaluator, the
workers, the integrator, the tuned config): built from a mapping ``{technique: {knob: value}}`` it holds
each technique's full, coerced values (missing knobs at their off value), techniques in name order, and
it cannot be changed afterwards, so a function handed one need not validate it again. It is a ``dict``
(of read-only dicts), so it is written to JSON, compared with plain dicts and read as before; it crosses
processes (Ray, pickle) without being validated again, since it was when it was built.

The functions over a setting live here too: parsing command-line assignments, the composition check of
overlapping seams, the request and device checks, applying it to a pipeline, the stages it touches and
the compiled graphs it depends on.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Union

from vidtune.techniques.registry import Patch, Technique, get
from vidtune.techniques.knobs import KnobError, Knobs, immutable
from vidtune.techniques.seams import overlap

__all__ = [
    "CompositionError",
    "KnobValues",
    "Knobs",
    "Setting",
    "SettingLike",
    "check_composition",
    "check_request",
    "compile_signature",
    "compiled_stages",
    "compose",
    "composition_rule",
    "overlapping_seams",
    "parse_knob_assignments",
    "resolve_values",
    "stages_touched",
]

# What the entry points accept: a Setting, or any mapping of technique -> knob values (validated on the way in)
SettingLike = Union["Setting", Mapping[str, Mapping[str, Any]]]
# Knob values per technique as typed on a command line or drawn by a sampler: not validated yet (a sampled
# setting may be invalid for a cross-knob reason, and its trial is then recorded failed with that reason)
KnobValues = dict[str, dict[str, Any]]


class Setting(dict):
    """Validated knob values per technique, read-only; see the module's docstring.

    ``Setting(values)`` validates (``KnobError`` names the technique and knob); ``Setting.of(x)`` returns
    ``x`` itself when it is a Setting already, so an entry point can take either at no cost.
    """

    __slots__ = ()
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = immutable

    def __init__(self, values: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        values = {} if values is None else values
        if not isinstance(values, Mapping):
            raise KnobError(f"a setting must map technique names to knob values, got {type(values).__name__}")
        resolved = {}
        for name in sorted(values):
            knobs = values[name]
            if not isinstance(knobs, Mapping):
                raise KnobError(f"{name}: knob values must be a mapping of knob -> value, got {knobs!r}")
            resolved[name] = Knobs(knobs if isinstance(values, Setting) else get(name).validate(knobs))
        dict.__init__(self, resolved)

    @classmethod
    def of(cls, values: SettingLike | None) -> "Setting":
        """``values`` as a Setting: itself when it is one (validated already), else validated now."""
        return values if isinstance(values, Setting) else cls(values)

    @classmethod
    def _trusted(cls, plain: Mapping[str, Mapping[str, Any]]) -> "Setting":
        """Rebuilt from a pickled Setting: validated when it was built, so not again (the receiving
        process need not have the same throw-away techniques registered)."""
        out = dict.__new__(cls)
        dict.__init__(out, {n: Knobs(v) for n, v in plain.items()})
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (Setting._trusted, (self.to_dict(),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Setting({dict.__repr__(self)})"

    @property
    def key(self) -> str:
        """The setting as canonical JSON (techniques and knobs sorted): equal settings, equal keys."""
        return json.dumps(self, sort_keys=True, default=str)

    def to_dict(self) -> KnobValues:
        """A plain, mutable copy (YAML writers and callers that build on it)."""
        return {n: dict(v) for n, v in self.items()}

    def with_values(self, name: str, values: Mapping[str, Any]) -> "Setting":
        """This setting with technique ``name`` set to ``values`` (validated)."""
        return Setting._trusted({**self.to_dict(), name: get(name).validate(values)})

    def without(self, *names: str) -> "Setting":
        return Setting._trusted({n: dict(v) for n, v in self.items() if n not in names})


def _yaml_representers() -> None:
    """YAML writes a Setting and its Knobs as the plain mappings they are (its safe dumper knows exact types only)."""
    import yaml

    for cls in (Setting, Knobs):
        for dumper in (yaml.SafeDumper, yaml.Dumper):
            dumper.add_representer(cls, lambda d, data: d.represent_dict(dict(data)))


_yaml_representers()


class CompositionError(ValueError):
    """Two techniques claim the same seam and have no composition rule."""


def parse_knob_assignments(items: Iterable[str]) -> KnobValues:
    """Parse ``["kernel_choice.sdpa_backend.video_self=flash", ...]`` into values per technique (strings,
    as typed; ``Setting`` coerces and validates them).

    Raises ``KnobError`` for malformed items and unknown techniques or knobs.
    """
    out: KnobValues = {}
    for item in items:
        if "=" not in item:
            raise KnobError(f"knob assignment must look like <family>.<technique>.<knob>=<value>, got {item!r}")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 3:
            raise KnobError(f"knob name must be <family>.<technique>.<knob>, got {key!r}")
        technique = get(".".join(parts[:2]))
        technique.knob(parts[2])
        out.setdefault(technique.name, {})[parts[2]] = value.strip()
    return out


def resolve_values(values: SettingLike) -> Setting:
    """Validate values per technique; returns the full coerced values, techniques in name order."""
    return Setting.of(values)


def compile_signature(values: SettingLike) -> str | None:
    """What a compiled setting's graphs depend on, as one string; None when the setting compiles nothing.

    Every technique that ``shapes_graphs`` (all but the caching family's, which decide which steps run,
    not what a step's code is): the compile mode, the kernels it traces (FP8, Sol, fused norms, backends)
    and the tile shapes. Two trials of one signature reuse the graphs Dynamo and Inductor built for the
    first in the same process, so the campaign runs them on the same actor; a trial of another signature
    compiles afresh (or loads from the persistent compile cache)."""
    setting = Setting.of(values)
    if not any(get(name).compiles(v) for name, v in setting.items()):
        return None
    return json.dumps({n: v for n, v in setting.items() if get(n).shapes_graphs}, sort_keys=True, default=str)


def compiled_stages(values: SettingLike) -> list[str]:
    """The pipeline stages whose graphs ``values`` compiles (the stages of its techniques that compile, e.g. the
    two transformer stages for ``kernel_choice.compile``, the video decode for the decoder's compile), in order."""
    from vidtune.model.generation import STAGES

    stages: set[str] = set()
    for name, v in Setting.of(values).items():
        if get(name).compiles(v):
            stages.update(get(name).stages_for(v))
    return [s for s in STAGES if s in stages]


class ComposedPatch(Patch):
    """Patches of several techniques applied in order; undone in reverse."""

    def __init__(self, parts: list[Patch]) -> None:
        super().__init__("+".join(p.label for p in parts))
        self.parts = parts
        for p in parts:
            self.touched.extend(p.touched)

    def undo(self) -> None:
        super().undo()  # changes made on the composed patch itself, after its parts were applied
        for p in reversed(self.parts):
            p.undo()
        self.undone = True


def composition_rule(a: Technique, b: Technique) -> str | None:
    """The rule under which ``a`` and ``b`` share overlapping seams (declared by either), or None."""
    return a.composes_with.get(b.name) or b.composes_with.get(a.name)


def overlapping_seams(a: Technique, b: Technique) -> list[tuple[str, str]]:
    """Pairs (seam of ``a``, seam of ``b``) that are the same place or nested (techniques/seams.py)."""
    return [(x, y) for x in a.seams for y in b.seams if overlap(x, y)]


def check_composition(values: SettingLike) -> list[tuple[Technique, Knobs]]:
    """Validate a setting and its seams without touching a pipeline; returns the active techniques.

    Every pair of active techniques whose seams overlap (the same seam, or one nested in the other, e.g.
    ``attention.video_self`` around ``attention.video_self.sparse``) needs a composition rule declared by
    one of them in ``composes_with`` (e.g. sparse attention falling back to the chosen dense backend).
    Techniques whose knobs are all off claim nothing.
    """
    setting = Setting.of(values)
    active = [(get(n), v) for n, v in setting.items() if not get(n).is_off(v)]
    for i, (a, _) in enumerate(active):
        for b, _ in active[i + 1:]:
            shared = overlapping_seams(a, b)
            if shared and composition_rule(a, b) is None:
                x, y = shared[0]
                where = f"seam {x!r}" if x == y else f"seams {x!r} and {y!r} (nested)"
                raise CompositionError(
                    f"techniques {a.name} and {b.name} both claim {where} and have no composition "
                    f"rule; turn one of them off"
                )
    return sorted(active, key=lambda tv: tv[0].apply_last)  # stable: name order otherwise


def check_request(values: SettingLike, request: Any, device: Any = None) -> None:
    """Run every active technique's request- (and, given ``device``, device-) dependent validation,
    before any model work."""
    import torch

    for tech, v in check_composition(values):
        tech.check_request(v, request)
        if device is not None:
            tech.check_device(v, torch.device(device))


def compose(pipeline: Any, values: SettingLike) -> Patch:
    """Apply several techniques together; conflicting seams are rejected before the pipeline is touched."""
    parts: list[Patch] = []
    try:
        for tech, v in check_composition(values):
            parts.append(tech.apply(pipeline, v))
    except Exception:
        for p in reversed(parts):
            p.undo()
        raise
    return ComposedPatch(parts)


def stages_touched(values: SettingLike) -> list[str]:
    """Pipeline stages whose output an (active) setting can change, in pipeline order."""
    from vidtune.model.generation import STAGES

    touched: set[str] = set()
    for name, v in Setting.of(values).items():
        tech = get(name)
        if not tech.is_off(v):
            touched.update(tech.stages_for(v))
    return [s for s in STAGES if s in touched]
