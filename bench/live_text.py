"""What drawing a streamed reply costs in the page, for a long reply:

    python bench/live_text.py [--chars 200000] [--repeat 1]

Runs the browser test ``tests/ui/test_conversation_ui.py::test_live_text_streams_then_the_saved_message_replaces_it``
(headless Chromium), which streams a reply into a conversation and then measures, in its root view,
a reply of ``--chars`` characters grown by 200 a frame (each frame laid out): drawn by the page's
own ``drawLive`` (only what came since the last frame is added) and drawn whole each frame, as the
page did before; prints both totals, each one's last frame, and their ratio. A model streams a
frame's worth of text many times a second, so a frame that costs its whole reply's length makes a
long reply's page slower with every word. Needs what the browser tests need (Debian's Chromium,
``.ci/browser-up.sh``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.browser_test import print_figures

TEST = "tests/ui/test_conversation_ui.py::test_live_text_streams_then_the_saved_message_replaces_it"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", type=int, default=200_000, help="characters of the measured reply")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the test, one figure each")
    args = parser.parse_args()
    return print_figures(TEST, "live text ", {"CANOPY_BENCH_LIVE_CHARS": str(args.chars)}, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
