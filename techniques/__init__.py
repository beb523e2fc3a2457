"""The knob registry and every built-in technique, one module per technique, grouped by family."""

from vidtune.techniques.registry import FAMILIES, Knob, KnobError, Patch, Technique, get, register, registered
from vidtune.techniques.setting import (
    CompositionError,
    Setting,
    compose,
    parse_knob_assignments,
    resolve_values,
    stages_touched,
)

# Importing the family packages registers their techniques.
from vidtune.techniques import caching, kernel_choice, memory, parallelism, sparse_attention, tiling  # noqa: E402,F401

__all__ = [
    "FAMILIES",
    "CompositionError",
    "Knob",
    "KnobError",
    "Patch",
    "Setting",
    "Technique",
    "compose",
    "get",
    "parse_knob_assignments",
    "register",
    "registered",
    "resolve_values",
    "stages_touched",
]
