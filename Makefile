# sglang-ctxprof: two set-up commands, `make demo` and `make test`. Both build .venv first.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ctxprof-installed
# pip prints one warning per package for this machine's optional local mirrors; hide only those.
QUIET_PIP := grep -v "^WARNING: Location 'file://" || true
export SGLANG_USE_CPU_ENGINE := 1
export OMP_NUM_THREADS := 1

.PHONY: install demo test test-unit clean fetch-compat check-compat

install: $(STAMP)

$(STAMP): pyproject.toml patches/sglang_cpu/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip wheel setuptools 2>&1 | $(QUIET_PIP)
	@echo "installing sglang==0.5.23 (torch 2.14.1 from the local file; ~150 s, ~11 GB) ..."
	$(BIN)/pip install -q sglang==0.5.23 2>&1 | $(QUIET_PIP)
	$(BIN)/pip install -q -e '.[test]' -e patches/sglang_cpu 2>&1 | $(QUIET_PIP)
	$(BIN)/python -c "import sglang, sglang_ctxprof, common_ops; print('sglang', sglang.__version__)"
	touch $@

demo: install
	$(BIN)/sglang-ctxprof demo

# The offline compatibility tests read the SGLang wheels of every supported release (AST only);
# fetch them first (12 releases, ~250 MB, cached). Without network they are skipped, and say so.
test: install
	-@$(MAKE) --no-print-directory fetch-compat || echo "note: could not fetch SGLang wheels: the compat tests will be skipped"
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-unit: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not server"

clean:
	rm -rf .cache build *.egg-info

# SGLang releases the offline compatibility check reads (AST only; the wheels are never installed).
COMPAT_VERSIONS ?= 0.5.12 0.5.13 0.5.14 0.5.15 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23
WHEEL_CACHE := .cache/wheels

fetch-compat: install
	mkdir -p $(WHEEL_CACHE)
	for v in $(COMPAT_VERSIONS); do ls $(WHEEL_CACHE)/sglang-$$v-*.whl >/dev/null 2>&1 || \
	  $(BIN)/pip download -q --no-deps -d $(WHEEL_CACHE) sglang==$$v 2>&1 | $(QUIET_PIP); done

check-compat: install
	$(BIN)/python -m sglang_ctxprof.cli.compat --wheels $(WHEEL_CACHE)
