# The README's two commands: `make report` and `make test`. Each sets up what it needs first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.longctx-installed
RUN := PATH="$(CURDIR)/$(BIN):$$PATH"

.PHONY: report test setup tex clean

report: setup tex
	$(RUN) snakemake --cores 1 report/longctx.pdf

test: setup tex
	$(RUN) python -m pytest $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): envs/requirements.txt pyproject.toml
	bash envs/make-venv.sh "$(PYTHON)" "$(VENV)"
	$(BIN)/pip install -r envs/requirements.txt
	$(BIN)/pip install --no-deps --no-build-isolation -e .
	touch $@

tex:
	@bash envs/ensure-tex.sh

clean:
	rm -rf data build report .snakemake
