"""The knob registry: knobs as data, techniques as registered modules, undoable patches.

A technique declares its family, its knobs (each with a domain and an "off" value), the pipeline stages
it touches and the seams it claims, and ``apply(pipeline, values)`` returns a ``Patch`` whose ``undo``
restores the pipeline exactly. Every knob at its off value must leave the output bit-identical; the
conformance suite (tests/test_techniques_conformance.py) checks that for every registered technique.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Mapping

from vidtune.techniques.knobs import Knob, KnobError, Knobs  # noqa: F401  (Knob, KnobError: a technique's API)
from vidtune.techniques.seams import check_declared

__all__ = [
    "release_kept",
    "FAMILIES",
    "FAMILY_TRAITS",
    "Knob",
    "KnobError",
    "Patch",
    "Technique",
    "get",
    "register",
    "registered",
    "unregister",
]

FAMILIES: tuple[str, ...] = ("caching", "sparse_attention", "tiling", "kernel_choice", "parallelism", "memory")
# Class attributes a family gives each of its techniques unless the technique sets its own (see Technique)
FAMILY_TRAITS: dict[str, dict[str, bool]] = {"caching": {"shapes_graphs": False},
                                            "parallelism": {"spreads_work_only": True}}
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
    # Whether the technique changes the code of a compiled pass, so that its values belong to the compiled
    # graphs' signature (techniques/setting.py, compile_signature). Caching decides which steps run, not
    # what a step computes: False for that family (FAMILY_TRAITS).
    shapes_graphs: bool = True
    # Whether the technique changes only how the work is spread over processes, not what is computed: a
    # quality model in one process leaves it out (search/quality_model.py). True for parallelism.
    spreads_work_only: bool = False
    # Whether an active setting changes every transformer pass of the stages it touches the same way, whatever
    # the step (a kernel, a compile, a weight format): the latency model times one pass of it (``pass_steps``).
    uniform_passes: bool = False
    # Whether each knob's cost stands on its own (a backend per attention kind): a knob value that measured slower
    # than the baseline with every other knob off is slower beside any of them, and a later campaign does not draw
    # it again (search/knowledge.py ``losing_knobs``). False where knobs act together (a tile's size and overlap).
    independent_knobs: bool = False

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KnobError(f"{self.name} has no knob {name!r}; knobs: {[k.name for k in self.knobs]}")

    def off_values(self) -> dict[str, Any]:
        """Every knob at its off value."""
        return {k.name: k.off for k in self.knobs}

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Full, coerced knob values (missing knobs take their off value); raises ``KnobError``. A ``Knobs``
        (a Setting's values, validated when it was built) is taken as it is."""
        if isinstance(values, Knobs):
            return dict(values)
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

    def pass_steps(self, values: dict[str, Any], stage: str) -> int | None:
        """How an active setting acts on each transformer pass of a denoising ``stage``, for the latency model
        (search/latency_model.py): ``d``, it leaves the stage's first ``d`` steps as they are and changes every
        later pass the same way (0: every pass alike), so one replayed pass per class of steps shows its cost;
        None: it changes which passes run or how a pass is split, which one pass does not show. Default: 0 for a
        technique that sets ``uniform_passes``, else None."""
        return 0 if self.uniform_passes else None

    def cached_pass_cost(self, values: dict[str, Any], blocks: int) -> float | None:
        """For a cache that records its computed and cached passes per stage (``PassCounter``): what a cached pass
        costs, as a fraction of a computed one, for a transformer of ``blocks`` blocks; the latency model counts
        the passes of the setting's own first run with it. None (the default): not a counted cache."""
        return None

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
        full = values if isinstance(values, Knobs) else self.validate(values)
        if self.switch is not None:
            return full[self.switch] == self.knob(self.switch).off
        return all(full[k.name] == k.off for k in self.knobs)

    def apply(self, pipeline: Any, values: Mapping[str, Any]) -> Patch:
        """Validate ``values`` and patch ``pipeline``; a setting that ``is_off`` returns an empty patch."""
        if not isinstance(values, Knobs):
            values = Knobs(self.validate(values))
        if self.is_off(values):
            return Patch(self.name)
        return self.apply_active(pipeline, dict(values))

    @abstractmethod
    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        """Patch the pipeline for a validated, not-all-off setting."""

    def release(self) -> None:
        """Free what this technique keeps between its applications (captured CUDA graphs and their buffers),
        while it is not applied: ``release_kept`` calls it before a setting without it and after a failure."""

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
        for trait, value in FAMILY_TRAITS.get(family, {}).items():
            if trait not in cls.__dict__:
                setattr(cls, trait, value)
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


def release_kept(keep: Iterable[str] = ()) -> None:
    """Every registered technique but those named in ``keep`` frees what it keeps between applications: a worker
    calls it before each setting (what another setting kept would take memory from this one's run) and after a
    failure."""
    keep = set(keep)
    for name, technique in _REGISTRY.items():
        if name not in keep:
            technique.release()


def get(name: str) -> Technique:
    """The technique called ``name``; ``KnobError`` lists the registered names otherwise."""
    _load_builtin()
    if name not in _REGISTRY:
        raise KnobError(f"unknown technique {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def _load_builtin() -> None:
    import vidtune.techniques  # noqa: F401  (importing the package registers the built-in techniques)
