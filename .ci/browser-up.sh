#!/usr/bin/env bash
# Bring up what the browser tests (tests/ui) need: Debian's headless Chromium and a font for
# readable screenshots. Idempotent: every step checks first and says what it did or skipped.
#
#   bash .ci/browser-up.sh
#
# Playwright itself is a pip dependency (the "test" extra in pyproject.toml); its browser
# download (`playwright install`) is never used: the tests launch /usr/bin/chromium
# (override with CANOPY_CHROMIUM). Needs root for apt-get.
set -euo pipefail

CHROMIUM="${CANOPY_CHROMIUM:-/usr/bin/chromium}"

say() { echo "browser-up: $*"; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
[ -x "$CHROMIUM" ] || missing+=(chromium)
installed fonts-dejavu-core || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -eq 0 ]; then
    say "present: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM"), fonts-dejavu-core"
else
    say "installing ${missing[*]} (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    say "installed: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
fi

PYTHON="$(command -v python || command -v python3)"
if "$PYTHON" -c "import playwright" >/dev/null 2>&1; then
    say "python playwright present ($PYTHON)"
else
    say "note: python playwright is not installed for $PYTHON; pip install -e '.[test]' provides it"
fi
