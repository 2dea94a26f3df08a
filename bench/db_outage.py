"""How soon a tree goes on after PostgreSQL comes back from a crash, by how long it was down.

    python bench/db_outage.py [--outages 8 40 120] [--shape hosted|dedicated]

Runs tests/actors/database_restart_scenario.py (its own embedded PostgreSQL and Ray, the tests'
short leases) once per outage: the server is SIGQUIT while a tree of seven sessions works, kept
down that long, started again. Prints the seconds from the server being back to the root's result.
The tree's own work left after the crash is ~5 s (model steps of 1.5 s; a lease of 4 s has run out):
the rest is how soon every process of the runtime had connections again.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from persistence.embedded import stop_embedded
from tests.actors.helpers import scenario_findings
from tests.conftest import RUNTIME_ENV, SHAPES


async def one(outage: float, shape: str) -> dict[str, object]:
    data_dir = Path(tempfile.mkdtemp(prefix="cdo-", dir="/tmp"))  # short: the socket stays in it
    try:
        return await scenario_findings("tests.actors.database_restart_scenario", {
            **RUNTIME_ENV, **SHAPES[shape], "CANOPY_DATA_DIR": str(data_dir),
            "SCENARIO_OUTAGE_SECONDS": str(outage)}, timeout=600 + outage)
    finally:
        stop_embedded(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outages", type=float, nargs="+", default=[8.0, 40.0, 120.0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="hosted")
    args = parser.parse_args()
    print(f"{'down (s)':>9} {'back to result (s)':>19}  result")
    for outage in args.outages:
        found = await one(outage, args.shape)
        print(f"{found['down_seconds']:9.1f} {found['back_to_result_seconds']:19.1f}  {found['result'][0]}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
