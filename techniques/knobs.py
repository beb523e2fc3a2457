"""A technique's knobs as data: each knob's kind, domain, off value and how it scales with the model and the frame;
the validation that names the knob and what is allowed, and the Optuna suggestion of its domain."""

from __future__ import annotations

import math
from dataclasses import dataclass
import json
from typing import Any, NoReturn

__all__ = ["KINDS", "SCALES", "Knob", "KnobError", "Knobs"]

SCALES = ("depth", "size", "frames")  # what a knob may scale with (transfer_setting)
KINDS = ("categorical", "int", "float", "bool")


class KnobError(ValueError):
    """A knob name or value is invalid; the message names it and what is allowed."""


@dataclass(frozen=True)
class Knob:
    """One tunable parameter of a technique.

    Attributes:
        name: short name, unique within the technique (full name: ``<technique>.<name>``).
        kind: ``categorical``, ``int``, ``float`` or ``bool``.
        off: the value that disables the knob's effect (must itself be valid).
        choices: allowed values of a categorical knob.
        low: lower bound of an int/float knob (inclusive).
        high: upper bound of an int/float knob (inclusive).
        log: sample a float/int knob on a log scale.
        step: grid step of an int knob (default 1).
        help: one line on what the knob does.
        needs: ``(knob, value)``: the knob acts only where that other knob of the technique has that value
            (Sol's stage-1 dense steps need ``stages=both``). A search samples it only there; elsewhere
            it must stay at its off value.
        scales: what the value counts, where it depends on the model or the request: ``depth`` (transformer
            blocks), ``size`` (pixels or latent cells along the frame's long side), ``frames``; None: a
            value that means the same on any model and size (a threshold, a step, a switch).
            ``transfer_setting`` maps a setting to another model and request by these.
        fast: where the knob runs fastest, for a search's first probes (``vidtune.search.probes``): ``"low"`` or
            ``"high"`` (that end of the range a search asks) for an int/float knob, one of the choices for a
            categorical or bool one (a probe backs off a categorical of numbers along its choices, listed in order
            of speed either way round, toward the other end; one of names keeps its fast choice); None: no
            direction known (a backend, a kernel's mode).
    """

    name: str
    kind: str
    off: Any
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int = 1
    help: str = ""
    needs: tuple[str, Any] | None = None
    scales: str | None = None
    fast: Any = None

    def __post_init__(self) -> None:
        if self.scales not in (None, *SCALES):
            raise KnobError(f"knob {self.name}: scales must be one of {[None, *SCALES]}, got {self.scales!r}")
        if self.kind not in KINDS:
            raise KnobError(f"knob {self.name}: kind must be one of {list(KINDS)}, got {self.kind!r}")
        if self.kind == "categorical" and not self.choices:
            raise KnobError(f"knob {self.name}: a categorical knob needs choices")
        if self.kind in ("int", "float") and (self.low is None or self.high is None or self.low > self.high):
            raise KnobError(f"knob {self.name}: an {self.kind} knob needs low <= high")
        if self.log and (self.kind not in ("int", "float") or self.low is None or self.low <= 0):
            raise KnobError(f"knob {self.name}: log scale needs a numeric knob with low > 0")
        self.validate(self.off, prefix=self.name)
        if self.fast is not None:
            if self.kind in ("int", "float") and self.fast not in ("low", "high"):
                raise KnobError(f"knob {self.name}: fast must be 'low' or 'high' for an {self.kind} knob, got {self.fast!r}")
            if self.kind in ("categorical", "bool"):
                self.validate(self.fast, prefix=f"{self.name}.fast")

    def domain(self) -> dict[str, Any]:
        """JSON-able description of the domain (for ``vidtune knobs --json``)."""
        d: dict[str, Any] = {"kind": self.kind, "off": self.off}
        if self.kind == "categorical":
            d["choices"] = list(self.choices)
        elif self.kind in ("int", "float"):
            d.update(low=self.low, high=self.high, log=self.log)
            if self.kind == "int" and self.step != 1:
                d["step"] = self.step
        if self.needs is not None:
            d["needs"] = {self.needs[0]: self.needs[1]}
        if self.fast is not None:
            d["fast"] = self.fast
        return d

    def describe_domain(self) -> str:
        """Human-readable domain, used in error messages."""
        if self.kind == "categorical":
            return f"one of {list(self.choices)}"
        if self.kind == "bool":
            return "true or false"
        scale = ", log scale" if self.log else ""
        article = "an" if self.kind == "int" else "a"
        return f"{article} {self.kind} in [{self.low}, {self.high}]{scale}"

    def validate(self, value: Any, prefix: str | None = None) -> Any:
        """Return ``value`` coerced to the knob's type, or raise ``KnobError`` naming the knob."""
        label = prefix or self.name
        bad = KnobError(f"{label} must be {self.describe_domain()}, got {value!r}")
        if self.kind == "categorical":
            for choice in self.choices:
                if value == choice or (isinstance(value, str) and str(choice) == value):
                    return choice
            raise bad
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "on", "off"):
                return value.lower() in ("true", "1", "on")
            raise bad
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(value) if self.kind == "float" else _as_int(value)
        except (TypeError, ValueError):
            raise bad from None
        if isinstance(number, float) and not math.isfinite(number):
            raise bad
        if not (self.low <= number <= self.high):
            raise bad
        if self.kind == "int" and (number - int(self.low)) % self.step:
            raise KnobError(f"{label} must be {self.describe_domain()} in steps of {self.step}, got {value!r}")
        return number

    def domain_values(self) -> list[Any]:
        """Every value of a categorical or bool knob (numeric knobs have a range, not a list)."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "bool":
            return [False, True]
        raise KnobError(f"knob {self.name} is {self.kind}: it has a range, not a list of values")

    def suggest(self, trial: Any, full_name: str) -> Any:
        """Sample a value with an Optuna trial (``suggest_*``)."""
        if self.kind in ("categorical", "bool"):
            return trial.suggest_categorical(full_name, self.domain_values())
        if self.kind == "int":
            return trial.suggest_int(full_name, int(self.low), int(self.high), step=self.step, log=self.log)
        return trial.suggest_float(full_name, float(self.low), float(self.high), log=self.log)


def _as_int(value: Any) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise ValueError(value)


def immutable(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(f"a {type(self).__name__} cannot be changed: build another (Setting.with_values, "
                    f"Setting.without, or Setting.to_dict() for a plain copy)")


class Knobs(dict):
    """One technique's validated knob values, read-only. Only a ``Setting`` (techniques/setting.py) builds them,
    from values its technique validated, so ``Technique.validate`` takes them as they are."""

    __slots__ = ()
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = immutable

    def __reduce__(self) -> tuple[Any, ...]:
        return (Knobs, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True, default=str))
