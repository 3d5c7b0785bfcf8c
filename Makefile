# g2c-grader: every target works as the first command on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BROWSER := $(VENV)/.browser

# $(call debian_package,COMMAND,PACKAGE,WHY): install PACKAGE when COMMAND is missing (as root
# with apt-get; `apt-get update` first, as a fresh machine needs), else warn with WHY.
define debian_package
	@if ! command -v $(1) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $(2)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2); \
	  else \
	    echo "WARNING: $(2) is missing and cannot be installed here: $(3)" >&2; \
	  fi; \
	fi
endef
# `make grade` grades each assignment's examples (examples/submissions/<assignment>/) into
# out/<assignment>/; `make grade ASSIGNMENT=name SUBMISSIONS=path OUT=dir` grades one folder.
ASSIGNMENTS := linear_attention linear_attention_hyena
ASSIGNMENT ?= linear_attention
SUBMISSIONS ?=
OUT ?= out
WORKERS ?=

.PHONY: install test grade validate assign report realrun bench docs clean peers

install: $(STAMP)

$(STAMP): pyproject.toml
	$(call debian_package,bwrap,bubblewrap,grading needs it or --allow-unsandboxed)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch lies on this machine's disk; never ask for an unpinned torch.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,dask,docs]'
	touch $(STAMP)

# Debian's chromium, for the pages' browser tests only (no browser build can be downloaded), and
# the pinned axe-core from npm that those tests inject for their accessibility scan.
AXE_CORE := axe-core@4.11.0
$(BROWSER): $(STAMP)
	$(call debian_package,chromium,chromium,the browser tests of the report pages need it)
	$(call debian_package,npm,npm,the accessibility scan of the report pages needs axe-core from npm)
	npm install --silent --no-audit --no-fund --prefix $(VENV) $(AXE_CORE)
	touch $(BROWSER)

# The peers whose formats `grader import` reads, each in a venv of its own (never .venv: they pin
# other jupyter packages), from the package registry: tests/test_import_*.py grade with them as oracles.
PEERS := out/peers
OTTER_PEER := $(PEERS)/otter-venv/.installed
NBGRADER_PEER := $(PEERS)/nbgrader-venv/.installed
peers: $(OTTER_PEER) $(NBGRADER_PEER)

$(OTTER_PEER):
	rm -rf $(PEERS)/otter-venv && $(PYTHON) -m venv $(PEERS)/otter-venv
	$(PEERS)/otter-venv/bin/pip install -q otter-grader==7.0.0 numpy==2.4.6 ipykernel==7.4.0
	touch $@

$(NBGRADER_PEER):
	rm -rf $(PEERS)/nbgrader-venv && $(PYTHON) -m venv $(PEERS)/nbgrader-venv
	$(PEERS)/nbgrader-venv/bin/pip install -q nbgrader==0.9.6 numpy==2.4.6
	touch $@

# Two test processes: while one runs single-threaded checks, the other's sandboxed batches fill
# the second core. Each file runs whole in one of them, so its module fixtures are built once.
test: $(STAMP) $(BROWSER) peers
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

grade: $(STAMP)
ifeq ($(SUBMISSIONS),)
	set -e; for name in $(ASSIGNMENTS); do \
	  $(BIN)/grader grade examples/submissions/$$name --assignment $$name --out $(OUT)/$$name $(if $(WORKERS),--workers $(WORKERS)); \
	done
else
	$(BIN)/grader grade $(SUBMISSIONS) --assignment $(ASSIGNMENT) --out $(OUT) $(if $(WORKERS),--workers $(WORKERS))
endif

validate: $(STAMP)
	$(BIN)/grader validate --assignment $(ASSIGNMENT)

# Every assignment's student notebook and check.py, from its master (cheap, so all of them).
assign: $(STAMP)
	set -e; for name in $(ASSIGNMENTS); do $(BIN)/grader assign solutions/$$name/$$name.ipynb; done

# Re-render after TA overrides: each out/<assignment>/ that `make grade` wrote, or OUT itself.
report: $(STAMP)
	set -e; found=; for name in $(ASSIGNMENTS); do \
	  if [ -d $(OUT)/$$name ]; then found=1; $(BIN)/grader report $(OUT)/$$name; fi; \
	done; [ -n "$$found" ] || $(BIN)/grader report $(OUT)

# The master notebook at the module's real sizes (about 12 min on 2 idle cores; not part of `make test`).
realrun: $(STAMP)
	$(BIN)/python solutions/linear_attention/realrun.py

# What grading costs, side by side in one run (bench/run.py; docs/benchmarks.md): printed with
# each target and written to out/bench/bench.json. `make bench QUICK=1`: one round on smaller sets.
# The first run also makes out/bench/otter-venv (otter-grader 7.0.0, from the package registry).
QUICK ?=
bench: $(STAMP)
	$(BIN)/python bench/run.py $(if $(QUICK),--quick)

# The documentation site (mkdocs.yml, docs/) into site/, strictly: a broken link or anchor, or a
# reference table that no longer matches the code, fails the build (docs/contributing.md).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(OUT) site .grader-cache build *.egg-info
