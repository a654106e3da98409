#!/usr/bin/env bash
# Run by Snakemake (--use-conda) once the conda environment envs/longctx.yaml is created: Apache Otava without its
# dependencies, as `make setup` installs envs/otava.txt (the same pin; tests/test_history.py checks they agree).
# Snakemake runs a copy of this file, so the pin is written here rather than read from envs/otava.txt.
set -euo pipefail
python -m pip install --no-deps "apache-otava==0.8.0"
