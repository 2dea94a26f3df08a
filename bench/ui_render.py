"""What one render of a conversation costs in the page, for a long history with large tool results:

    python bench/ui_render.py [--steps 1500] [--output-kb 64] [--repeat 1]

Runs the browser test ``tests/ui/test_render_work_ui.py::test_a_rerender_reads_no_message_it_already_showed``
(headless Chromium) on a root whose history holds ``--steps`` model steps, each a text with a
run_command call and its JSON result padded with ``--output-kb`` KiB of output (2 messages a step;
the suite seeds 200 short ones to stay quick), and prints the figure it measured on the view's own
messages: the data work of one render done the old way (every tool result parsed and every message's
content signed, each render) and the way the page does it now (read once when fetched, signed by id),
and the view's whole render(). A conversation re-renders at every read of its tree while the tree is
busy (at most every 600 ms). Needs what the browser tests need (Debian's Chromium, ``.ci/browser-up.sh``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.browser_test import print_figures

TEST = "tests/ui/test_render_work_ui.py::test_a_rerender_reads_no_message_it_already_showed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="model steps (a call and its result each)")
    parser.add_argument("--output-kb", type=int, default=64, help="KiB of output in each tool result")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the test, one figure each")
    args = parser.parse_args()
    return print_figures(TEST, "render ", {"CANOPY_BENCH_RENDER_STEPS": str(args.steps),
                                           "CANOPY_BENCH_RENDER_OUTPUT_KB": str(args.output_kb)}, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
