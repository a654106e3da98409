#!/usr/bin/env bash
# Debian's SLURM and munge for the test that runs the workflow on a real single-node SLURM
# (tests/test_slurm.py): installed with apt-get when missing and running as root; otherwise the
# command to run is printed and the test skips. Services are not started: the test starts its own
# daemons and stops them by pid.
set -euo pipefail
PACKAGES="slurmctld slurmd slurm-client munge"
have_all() {
  for c in slurmctld slurmd sbatch squeue scancel munged munge; do
    command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] || return 1
  done
}
have_all && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing SLURM packages: $PACKAGES"
  # Keep apt from starting the packages' services (the test runs its own daemons), unless a
  # policy is already in place.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES; }
  have_all && exit 0
  echo "SLURM packages installed but a command is still missing" >&2
  exit 1
fi
echo "SLURM is not installed: the SLURM test will skip. To run it, install it with:" >&2
echo "  sudo apt-get install --no-install-recommends $PACKAGES" >&2
exit 0
