# Two commands for a fresh machine: `make simulate` and `make test`. Each creates .venv when missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: simulate federation test bench lint venv clean

venv: $(STAMP)

# torch first (pinned CPU wheel: an unpinned torch pulls gigabytes of CUDA packages), then CrypTen
# without its dependencies (its metadata requires the withdrawn `sklearn` package and torchvision),
# then this package with the dev extra. The stamp depends on pyproject.toml, so re-running is a no-op.
$(STAMP): pyproject.toml
	@$(PY) -c "import ctypes.util, sys; sys.exit(0 if ctypes.util.find_library('sodium') else 1)" || \
		{ echo "error: libsodium >= 1.0.18 is needed (Debian/Ubuntu: apt-get install libsodium23)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps crypten==0.4.1
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

simulate: $(STAMP)
	$(BIN)/python -m falsevfl_secure.simulate --protocol plain --out runs/simulate $(ARGS)

# Four parties, each with its own table of the digits data: align privately, train under mpc, predict, score.
federation: $(STAMP)
	$(BIN)/python -m falsevfl_secure.federation demo --dataset digits --parties 4 --out runs/federation
	$(BIN)/python -m falsevfl_secure.federation train --config runs/federation/federation.toml $(ARGS)
	$(BIN)/python -m falsevfl_secure.federation predict --config runs/federation/federation.toml --out runs/federation/predictions.csv
	$(BIN)/python -m falsevfl_secure.federation score --predictions runs/federation/predictions.csv --truth runs/federation/truth.csv

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/accuracy.py --dataset digits --train mcar:0.2 --variant I --seeds 0 --preset quick --out runs/bench

lint: $(STAMP)
	$(BIN)/ruff check falsevfl_secure tests bench

clean:
	rm -rf $(VENV) runs
