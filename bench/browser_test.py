"""Run one browser test of the suite at a bench's scale and print the figure it measured: the
benches whose figures only a real page gives (bench/timeline.py, bench/ui_render.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def print_figures(test: str, prefix: str, env: dict[str, str], repeat: int) -> int:
    """Run ``test`` ``repeat`` times with ``env`` added to the environment; print the last line of its
    output that starts with ``prefix`` after each run. Exit code 1 (and its output) when a run fails."""
    env = {**os.environ, **env, "CANOPY_REQUIRE_BROWSER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-n", "0", "-p", "no:logging",
                               "--timeout", "900", test], cwd=REPO, env=env, capture_output=True, text=True)
        figures = [line for line in done.stdout.splitlines() if line.startswith(prefix)]
        if done.returncode != 0 or not figures:
            print(done.stdout[-4000:] + done.stderr[-4000:], file=sys.stderr)
            return 1
        print(figures[-1], flush=True)
    return 0
