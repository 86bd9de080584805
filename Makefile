# Two commands for a fresh machine: `make simulate` and `make test`. Each creates .venv when missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: simulate test bench lint venv clean

venv: $(STAMP)

# torch first (pinned CPU wheel: an unpinned torch pulls gigabytes of CUDA packages), then CrypTen
# without its dependencies (its metadata requires the withdrawn `sklearn` package and torchvision),
# then this package with the dev extra. The stamp depends on pyproject.toml, so re-running is a no-op.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps crypten==0.4.1
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

simulate: $(STAMP)
	$(BIN)/python -m falsevfl_secure.simulate --protocol plain --out runs/simulate $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/accuracy.py --dataset digits --train mcar:0.2 --variant I --seeds 0 --preset quick --out runs/bench

lint: $(STAMP)
	$(BIN)/ruff check falsevfl_secure tests bench

clean:
	rm -rf $(VENV) runs
