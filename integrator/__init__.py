"""The integrator: combinations of each family's surviving candidates, the quality gate, tuned-config
export and reports. Lands with issue "Search campaigns"; the package exists so the layout is complete."""
