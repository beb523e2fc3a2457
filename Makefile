# vidtune: `make run` sets up and runs the default job; `make test` sets up and runs the tests.
# Setup is one virtual environment in .venv. torch is installed first and pinned to the CPU wheel that
# CPU machines here carry (ENVIRONMENT.md: without it ltx-core pulls a 5.9 GB CUDA build); on a GPU
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
	touch $@

setup: $(STAMP)

# The default job on the tiny preset: the baseline (reused when its key matches), then every SDPA
# backend measured against it (latency per stage, PSNR/SSIM/audio SNR). The Optuna campaign
# (`vidtune campaign`) replaces this job when the search-campaign issue lands.
run: $(STAMP)
	$(BIN)/vidtune baseline
	for b in cudnn flash efficient math; do \
	  $(BIN)/vidtune evaluate --knobs $$(for k in video_self audio_self text_cross a2v v2a; do \
	    printf 'kernel_choice.sdpa_backend.%s=%s ' $$k $$b; done) || exit 1; \
	done

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) results/default
