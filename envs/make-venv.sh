#!/usr/bin/env bash
# Create the virtual environment; on Debian/Ubuntu without python3-venv, install it when root.
set -euo pipefail
python=$1 venv=$2
if [ -x "$venv/bin/python" ]; then exit 0; fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "longctx needs Python 3.11 or newer; $python is $("$python" --version 2>&1)" >&2
  exit 1
fi
if "$python" -m venv "$venv" 2>/dev/null; then exit 0; fi
rm -rf "$venv"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  ver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "python${ver}-venv" \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
  exec "$python" -m venv "$venv"
fi
echo "cannot create a virtual environment with $python: install it with: sudo apt-get install python3-venv" >&2
exit 1
