# vidtune: `make run` sets up and runs the default job; `make test` sets up and runs the tests.
# Setup is one virtual environment in .venv. torch is installed first and pinned to the CPU wheel that
# CPU machines carry (docs/environment.md: without it ltx-core pulls a 5.9 GB CUDA build); on a GPU
# machine run `make TORCH=torch run` to keep the CUDA build.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.vidtune-installed

.PHONY: setup run test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[test]'
	# NATTEN (sparse_attention.window) is a source package: built against the installed torch it is
	# pure Python on a CPU (docs/environment.md, 4 s). Optional: its tests skip without it.
	$(BIN)/python -m pip install -q --no-build-isolation natten==0.21.7 || echo "natten not installed: window tests skip"
	# nvidia-cutlass-dsl (sparse_attention backend=cute, Hopper GPUs): on a CPU it still compiles the CuTe
	# kernel to sm_90a PTX, which a test checks. Optional: that test skips without it.
	$(BIN)/python -m pip install -q nvidia-cutlass-dsl==4.8.1 || echo "nvidia-cutlass-dsl not installed: the CuTe compile test skips"
	# The MCP SDK (`vidtune mcp`, agents): optional, its test skips without it
	$(BIN)/python -m pip install -q 'mcp>=2' || echo "mcp not installed: the MCP server's test skips"
	# optuna-dashboard (`vidtune dashboard`): optional, its test skips without it
	$(BIN)/python -m pip install -q 'optuna-dashboard>=0.15' || echo "optuna-dashboard not installed: the dashboard's test skips"
	touch $@

setup: $(STAMP)

# The default job: a search campaign on ltx2-mini, the shipped small trained model (baseline, one Optuna
# study per family on a local Ray, the integrator, results/default/tuned.yaml). Re-running it resumes the
# same campaign.
run: $(STAMP)
	$(BIN)/vidtune campaign

# The suite on JOBS pytest-xdist workers (the cores, at most 4), its 25 slowest tests listed at the end
# (results/tests/durations.md): each worker, and every process it starts, is pinned to its share of the cores
# (tests/conftest.py); tests sharing an expensive module fixture run on one worker (--dist loadgroup)
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; [ $$n -lt 2 ] && n=2; echo $$n)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup --durations=25

clean:
	rm -rf $(VENV) results/default
