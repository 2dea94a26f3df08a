"""The timeline tab's frame times for a 500-member tree with 10,000 Runs (30,000 intervals):

    python bench/timeline.py [--turns 16] [--repeat 1]

Runs the browser test ``tests/ui/test_timeline_ui.py::test_500_members_render_only_what_is_on_screen``
(headless Chromium at 1600 x 900, a scripted 231-frame pan, zoom and lane scroll) with ``--turns``
Turns per member, where the suite seeds 2 to stay quick, and prints the figure it measured: draw
time per frame and the interval between frames. Needs what the browser tests need (Debian's
Chromium, ``.ci/browser-up.sh``); the seeding through the repositories takes a minute or two.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.browser_test import print_figures

TEST = "tests/ui/test_timeline_ui.py::test_500_members_render_only_what_is_on_screen"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=16, help="Turns per member (every 4th waits once)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the test, one figure each")
    args = parser.parse_args()
    return print_figures(TEST, "timeline ", {"CANOPY_BENCH_TIMELINE_TURNS": str(args.turns)}, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
