#!/usr/bin/env bash
# TeX for the report and poppler's pdftotext for the tests: installed with apt-get when missing
# and running as root; otherwise the command to run is printed.
set -euo pipefail
PACKAGES="texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended texlive-science lmodern latexmk poppler-utils"
STYLES="booktabs.sty longtable.sty placeins.sty graphicx.sty hyperref.sty geometry.sty lmodern.sty siunitx.sty"
have_all() {
  command -v latexmk >/dev/null && command -v pdflatex >/dev/null && command -v pdftotext >/dev/null \
    && command -v kpsewhich >/dev/null || return 1
  local s
  for s in $STYLES; do [ -n "$(kpsewhich "$s")" ] || return 1; done
}
have_all && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing TeX packages: $PACKAGES"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES
  have_all && exit 0
  echo "TeX packages installed but something is still missing (styles: $STYLES)" >&2
  exit 1
fi
echo "TeX is missing. Install it with:" >&2
echo "  sudo apt-get install --no-install-recommends $PACKAGES" >&2
exit 1
