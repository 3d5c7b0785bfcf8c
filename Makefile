# g2c-grader: every target works as the first command on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ASSIGNMENT ?= linear_attention
SUBMISSIONS ?= examples/submissions
OUT ?= out
WORKERS ?=

.PHONY: install test grade validate assign report clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (the grader's sandbox)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; \
	  else \
	    echo "WARNING: bubblewrap is missing and cannot be installed here; grading needs --allow-unsandboxed" >&2; \
	  fi; \
	fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch lies on this machine's disk; never ask for an unpinned torch.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

grade: $(STAMP)
	$(BIN)/grader grade $(SUBMISSIONS) --assignment $(ASSIGNMENT) --out $(OUT) $(if $(WORKERS),--workers $(WORKERS))

validate: $(STAMP)
	$(BIN)/grader validate --assignment $(ASSIGNMENT)

assign: $(STAMP)
	$(BIN)/grader assign solutions/$(ASSIGNMENT)/$(ASSIGNMENT).ipynb

report: $(STAMP)
	$(BIN)/grader report $(OUT)

clean:
	rm -rf $(OUT) .grader-cache build *.egg-info
