"""The integrator: combinations of each family's surviving candidates, the quality gate, tuned-config
export and validation (reports land next)."""
