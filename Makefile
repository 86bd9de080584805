# Two commands for a fresh machine: `make simulate` and `make test`. Each creates .venv when missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=
# make test: pytest-xdist workers (two: CI's cores; most of the suite's wall time is real processes waiting on
# each other, so two workers share the cores; a `timed` test runs alone, tests/conftest.py). 0: one process.
WORKERS ?= 2

.PHONY: simulate federation test bench lint venv clean

venv: $(STAMP)

# torch first (pinned CPU wheel: an unpinned torch pulls gigabytes of CUDA packages), then this package with
# the dev extra (rbcl brings libsodium's ristretto255 along: no system library), then CrypTen last and
# without its dependencies: its metadata requires the withdrawn `sklearn` package, torchvision, tensorboard
# and `future`, none of which it imports. pip skips its dependency check for a --no-deps install but prints
# an ERROR line for each of CrypTen's absent packages whenever a later install touches one of CrypTen's
# dependencies, hence last. The last step imports CrypTen with those four blocked and says so.
# The stamp depends on pyproject.toml, so re-running is a no-op.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps crypten==0.4.1
	$(BIN)/python -c "from falsevfl_secure.secure import crypten_shim; raise SystemExit(crypten_shim.main())"
	touch $(STAMP)

simulate: $(STAMP)
	$(BIN)/python -m falsevfl_secure.simulate --protocol plain --out runs/simulate $(ARGS)

# Four parties, each with its own table of the digits data: align privately, train under mpc, predict, score.
federation: $(STAMP)
	test -f runs/federation/federation.toml || $(BIN)/python -m falsevfl_secure.federation demo --dataset digits --parties 4 --out runs/federation
	$(BIN)/python -m falsevfl_secure.federation train --config runs/federation/federation.toml $(ARGS)
	$(BIN)/python -m falsevfl_secure.federation predict --config runs/federation/federation.toml --out runs/federation/predictions.csv
	$(BIN)/python -m falsevfl_secure.federation score --predictions runs/federation/predictions.csv --truth runs/federation/truth.csv

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -n $(WORKERS) $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/accuracy.py --dataset digits --train mcar:0.2 --variant I --seeds 0 --preset quick --out runs/bench

lint: $(STAMP)
	$(BIN)/ruff check falsevfl_secure tests bench

clean:
	rm -rf $(VENV) runs
