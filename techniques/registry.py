"""The knob registry: knobs as data, techniques as registered modules, undoable patches, composition.

A technique declares its family, its knobs (each with a domain and an "off" value), the pipeline stages
it touches and the seams it claims, and ``apply(pipeline, values)`` returns a ``Patch`` whose ``undo``
restores the pipeline exactly. Every knob at its off value must leave the output bit-identical; the
conformance suite (tests/test_techniques_conformance.py) checks that for every registered technique.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Mapping

from vidtune.techniques.knobs import Knob, KnobError  # noqa: F401  (re-exported: a technique's API)
from vidtune.techniques.seams import check_declared, overlap

__all__ = [
    "FAMILIES",
    "Knob",
    "KnobError",
    "Patch",
    "Technique",
    "CompositionError",
    "check_composition",
    "composition_rule",
    "overlapping_seams",
    "check_request",
    "compose",
    "get",
    "register",
    "registered",
    "parse_knob_assignments",
    "resolve_values",
    "stages_touched",
    "compile_signature",
    "unregister",
]

FAMILIES: tuple[str, ...] = ("caching", "sparse_attention", "tiling", "kernel_choice", "parallelism", "memory")
class CompositionError(ValueError):
    """Two techniques claim the same seam and have no composition rule."""


def compile_signature(values: Mapping[str, Mapping[str, Any]]) -> str | None:
    """What a compiled setting's graphs depend on, as one string; None when the setting compiles nothing.

    Everything but the caching family (which decides which steps run, not what a step's code is): the
    compile mode, the kernels it traces (FP8, Sol, fused norms, backends) and the tile shapes. Two trials
    of one signature reuse the graphs Dynamo and Inductor built for the first in the same process, so the
    campaign runs them on the same actor; a trial of another signature compiles afresh (or loads from the
    persistent compile cache)."""
    resolved = resolve_values(values)
    if not any(get(name).compiles(v) for name, v in resolved.items()):
        return None
    return json.dumps({n: v for n, v in sorted(resolved.items()) if get(n).family != "caching"}, sort_keys=True,
                      default=str)


class Patch:
    """An undoable set of attribute changes; ``undo`` restores them in reverse order."""

    _MISSING = object()

    def __init__(self, label: str = "") -> None:
        self.label = label
        self._undo: list[Callable[[], None]] = []
        self.undone = False
        # (object, attribute) of every change made through set_attr / set_value: the conformance suite
        # maps them to seams (techniques/seams.py) and checks them against the declared ones
        self.touched: list[tuple[Any, str]] = []

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        """Set ``obj.name = value``, remembering the previous value (or its absence)."""
        old = obj.__dict__.get(name, Patch._MISSING) if hasattr(obj, "__dict__") else getattr(obj, name)
        setattr(obj, name, value)
        self.touched.append((obj, name))

        def restore() -> None:
            if old is Patch._MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

        self._undo.append(restore)

    def set_value(self, obj: Any, name: str, value: Any) -> None:
        """Set an attribute that lives behind ``getattr`` (config modules), restoring the old value."""
        old = getattr(obj, name)
        setattr(obj, name, value)
        self.touched.append((obj, name))
        self._undo.append(lambda: setattr(obj, name, old))

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the patch is undone (for changes that are not attribute sets)."""
        self._undo.append(fn)

    def merge(self, other: "Patch") -> None:
        """Take over ``other``'s undo steps (undone after this patch's own later steps)."""
        self._undo.extend(other._undo)
        self.touched.extend(other.touched)
        other._undo = []

    def undo(self) -> None:
        """Restore everything this patch changed; a second call does nothing."""
        while self._undo:
            self._undo.pop()()
        self.undone = True

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


class Technique(ABC):
    """Base class of every registered technique (one module each, under ``techniques/<family>/``).

    Subclasses set the class attributes and implement ``apply_active``; ``apply`` validates the
    values, returns an empty patch when every knob is off, and otherwise delegates.
    """

    name: str = ""  # set by @register: "<family>.<technique>"
    family: str = ""
    knobs: tuple[Knob, ...] = ()
    stages: tuple[str, ...] = ()  # pipeline stages whose output the technique can change
    seams: tuple[str, ...] = ()  # seams it claims, declared in techniques/seams.py (nested names)
    # techniques whose seams may overlap this one's, each with the documented rule that makes it safe
    # (see check_composition); a rule on either side of a pair is enough
    composes_with: Mapping[str, str] = {}
    # Applied after every other technique (parallelism wraps the attention functions and passes the
    # others installed); otherwise techniques apply in name order.
    apply_last: bool = False
    # The knob whose off value turns the whole technique off, whatever the other knobs say (compile's
    # mode, Sol's beta, a parallel degree); None: the technique is off only when every knob is off.
    # A search that chose to use the technique never samples the switch's off value: that trial would
    # re-measure the baseline (seen on the H200: compile with mode=off crashed, cuda_graphs with
    # enabled=False and block_sparse with beta=off measured nothing but noise).
    switch: str | None = None
    description: str = ""

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KnobError(f"{self.name} has no knob {name!r}; knobs: {[k.name for k in self.knobs]}")

    def off_values(self) -> dict[str, Any]:
        """Every knob at its off value."""
        return {k.name: k.off for k in self.knobs}

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Full, coerced knob values (missing knobs take their off value); raises ``KnobError``."""
        unknown = sorted(set(values) - {k.name for k in self.knobs})
        if unknown:
            raise KnobError(
                f"{self.name} has no knob(s) {unknown}; knobs: {[k.name for k in self.knobs]}"
            )
        out = self.off_values()
        for k in self.knobs:
            if k.name in values:
                out[k.name] = k.validate(values[k.name], prefix=f"{self.name}.{k.name}")
        for k in self.knobs:
            if k.needs is not None and out[k.name] != k.off and out[k.needs[0]] != k.needs[1]:
                raise KnobError(f"{self.name}.{k.name}={out[k.name]!r} acts only with {self.name}.{k.needs[0]}="
                                f"{k.needs[1]!r} (got {out[k.needs[0]]!r}); set that, or leave "
                                f"{k.name} at {k.off!r}")
        self.check(out)
        return out

    def check(self, values: dict[str, Any]) -> None:
        """Cross-knob validation hook (raise ``KnobError``); values are already coerced."""

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        """Validation that needs the request (e.g. overlaps vs. the latent size); raise ``KnobError``.

        Called by the evaluator and the CLI for active techniques before any model work.
        """

    def applicable(self, request: Any = None) -> bool:
        """Whether a search should offer this technique for ``request`` at all (e.g. guidance
        parallelism needs a guided request and more than one rank); validation stays in the checks."""
        return True

    def stages_for(self, values: dict[str, Any]) -> tuple[str, ...]:
        """The stages an active, validated setting can change (``stages``: the most any setting can)."""
        return self.stages

    def canonical(self, values: dict[str, Any], request: Any) -> dict[str, Any]:
        """``values`` (validated) written the way a search samples them for ``request`` where another spelling
        gives the same run (a VAE tile larger than the video is the video's size): how a seed config's setting
        is put into a study's search space. Default: unchanged."""
        return values

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        """False when a (validated, not off) setting cannot change anything for ``request``, e.g. a cache
        whose warm-up covers every step. A search skips such a setting rather than measure the baseline
        again under another name (on the H200 a first-block cache with 7 warm-up steps of 8 did that)."""
        return True

    def check_device(self, values: dict[str, Any], device: Any) -> None:
        """Validation that needs the device (e.g. a kernel only built for CUDA); raise ``KnobError``."""

    # Why no setting of the technique can be exact (set where ``neutral`` returns None).
    inexact: str = ""

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        """A setting that is not off (``apply_active`` runs and installs the patch) yet leaves the output of
        ``request`` on ``device`` bit-identical: a cache threshold of 0, a tiling equal to the reference's.
        The conformance suite runs it against the reference output, so a patch that changes what it should
        not fails there. None when every active setting changes the arithmetic (``inexact`` says why) or,
        for parallelism, when this process is not in a world that can hold one."""
        return None

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        """Sample a setting with an Optuna trial (parameter names ``<technique>.<knob>``).

        Techniques whose valid ranges depend on the request (tile overlaps) override this so a search
        does not waste trials on settings that ``check_request`` would reject.
        """
        return self.suggest_restricted(trial, {})

    def suggest_restricted(self, trial: Any, choices: Mapping[str, Iterable[Any]]) -> dict[str, Any]:
        """``suggest`` with some categorical knobs limited to ``choices[knob]`` (what this machine can run);
        the lists must stay the same for a whole study (Optuna fixes a parameter's choices)."""
        out = {}
        for k in self.knobs:
            if k.needs is not None and out.get(k.needs[0], self.knob(k.needs[0]).off) != k.needs[1]:
                continue  # (a conditional parameter: Optuna's define-by-run space leaves it out of the trial)
            allowed = list(choices[k.name]) if k.name in choices else None
            full_name = f"{self.name}.{k.name}"
            if k.name == self.switch and k.kind in ("categorical", "bool"):  # "used" means switched on
                allowed = [c for c in (allowed if allowed is not None else k.domain_values()) if c != k.off]
                if not allowed:
                    raise KnobError(f"{full_name}: no value but the off one ({k.off!r}) can run here; "
                                    f"the technique should not be offered (see Technique.applicable)")
            if allowed is not None:
                out[k.name] = trial.suggest_categorical(full_name, allowed)
            elif k.name == self.switch and k.kind == "int" and k.off == k.low:  # e.g. step_skip.every: 1..4
                out[k.name] = trial.suggest_int(full_name, int(k.low) + k.step, int(k.high), step=k.step, log=k.log)
            else:  # (a float switch whose off is its low end is sampled there with probability 0)
                out[k.name] = k.suggest(trial, full_name)
        return out

    def compiles(self, values: Mapping[str, Any]) -> bool:
        """Whether this setting compiles code (torch.compile): the driver then keeps trials of the same
        compiled configuration on the same actor (``compile_signature``). Compiling techniques override it."""
        return False

    def is_off(self, values: Mapping[str, Any]) -> bool:
        """True when the switch knob is off, or (no switch) every knob is at its off value."""
        full = self.validate(values)
        if self.switch is not None:
            return full[self.switch] == self.knob(self.switch).off
        return all(full[k.name] == k.off for k in self.knobs)

    def apply(self, pipeline: Any, values: Mapping[str, Any]) -> Patch:
        """Validate ``values`` and patch ``pipeline``; a setting that ``is_off`` returns an empty patch."""
        full = self.validate(values)
        if self.is_off(full):
            return Patch(self.name)
        return self.apply_active(pipeline, full)

    @abstractmethod
    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        """Patch the pipeline for a validated, not-all-off setting."""

    def describe(self) -> dict[str, Any]:
        """JSON-able description (for ``vidtune knobs``)."""
        return {
            "name": self.name,
            "family": self.family,
            "stages": list(self.stages),
            "seams": list(self.seams),
            "description": self.description,
            "knobs": {k.name: {**k.domain(), "help": k.help} for k in self.knobs},
        }


_REGISTRY: dict[str, Technique] = {}


def register(name: str) -> Callable[[type[Technique]], type[Technique]]:
    """Class decorator: ``@register("kernel_choice.sdpa_backend")`` registers one instance."""
    family = name.split(".", 1)[0]
    if family not in FAMILIES or "." not in name:
        raise ValueError(f"technique name must be '<family>.<name>' with family in {list(FAMILIES)}, got {name!r}")

    def deco(cls: type[Technique]) -> type[Technique]:
        if name in _REGISTRY and type(_REGISTRY[name]) is not cls:
            raise ValueError(f"technique {name!r} is already registered by {type(_REGISTRY[name]).__name__}")
        cls.name = name
        cls.family = family
        names = [k.name for k in cls.knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"technique {name!r} declares a knob twice: {names}")
        if cls.switch is not None and cls.switch not in names:
            raise ValueError(f"technique {name!r}: switch {cls.switch!r} is not one of its knobs {names}")
        check_declared(tuple(cls.seams), f"technique {name!r}")
        _REGISTRY[name] = cls()
        return cls

    return deco


def unregister(name: str) -> None:
    """Remove a technique (for tests that register throw-away techniques)."""
    _REGISTRY.pop(name, None)


def registered(family: str | None = None) -> list[Technique]:
    """Registered techniques (of one family), sorted by name."""
    _load_builtin()
    if family is not None and family not in FAMILIES:
        raise KnobError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    return [t for n, t in sorted(_REGISTRY.items()) if family is None or t.family == family]


def get(name: str) -> Technique:
    """The technique called ``name``; ``KnobError`` lists the registered names otherwise."""
    _load_builtin()
    if name not in _REGISTRY:
        raise KnobError(f"unknown technique {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def _load_builtin() -> None:
    import vidtune.techniques  # noqa: F401  (importing the package registers the built-in techniques)


def parse_knob_assignments(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Parse ``["kernel_choice.sdpa_backend.video_self=flash", ...]`` into values per technique.

    Raises ``KnobError`` for malformed items and unknown techniques or knobs (values are validated by
    ``resolve_values``).
    """
    out: dict[str, dict[str, Any]] = {}
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


def resolve_values(values: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Validate values per technique; returns full coerced values, techniques in name order."""
    return {name: get(name).validate(v) for name, v in sorted(values.items())}


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


def check_composition(values: Mapping[str, Mapping[str, Any]]) -> list[tuple[Technique, dict[str, Any]]]:
    """Validate a setting and its seams without touching a pipeline; returns the active techniques.

    Every pair of active techniques whose seams overlap (the same seam, or one nested in the other, e.g.
    ``attention.video_self`` around ``attention.video_self.sparse``) needs a composition rule declared by
    one of them in ``composes_with`` (e.g. sparse attention falling back to the chosen dense backend).
    Techniques whose knobs are all off claim nothing.
    """
    resolved = resolve_values(values)
    active = [(get(n), v) for n, v in resolved.items() if not get(n).is_off(v)]
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


def check_request(values: Mapping[str, Mapping[str, Any]], request: Any, device: Any = None) -> None:
    """Run every active technique's request- (and, given ``device``, device-) dependent validation,
    before any model work."""
    import torch

    for tech, v in check_composition(values):
        tech.check_request(v, request)
        if device is not None:
            tech.check_device(v, torch.device(device))


def compose(pipeline: Any, values: Mapping[str, Mapping[str, Any]]) -> Patch:
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


def stages_touched(values: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Pipeline stages whose output an (active) setting can change, in pipeline order."""
    from vidtune.model.pipeline import STAGES

    touched: set[str] = set()
    for name, v in values.items():
        tech = get(name)
        if not tech.is_off(v):
            touched.update(tech.stages_for(tech.validate(v)))
    return [s for s in STAGES if s in touched]

