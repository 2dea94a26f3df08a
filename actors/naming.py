"""Actor names and options: the Ray dashboard shows ``session:…``, ``tree:…`` and ``canopy:…``."""

from __future__ import annotations

import uuid
from typing import Any

NAMESPACE = "canopy"
GATEWAY_NAME = "canopy:model-gateway"
SWEEPER_NAME = "canopy:sweeper"


def session_actor_name(session_id: uuid.UUID | str) -> str:
    return f"session:{session_id}"


def directory_actor_name(node_id: str) -> str:
    """The live-session directory of one Ray node (see actors/directory.py)."""
    return f"canopy:directory:{node_id}"


def tree_actor_name(tree_id: uuid.UUID | str) -> str:
    return f"tree:{tree_id}"


def named_options(name: str, **extra: Any) -> dict[str, Any]:
    """Detached (no fate-sharing with whoever created it), restartable, zero-CPU, get-or-create."""
    return {"name": name, "namespace": NAMESPACE, "get_if_exists": True, "lifetime": "detached",
            "max_restarts": -1, "num_cpus": 0, **extra}


def host_actor_name(index: int) -> str:
    """A shared session host (actors/placement.py); its sessions show as its tasks named ``session:<id>``."""
    return f"canopy:sessions:{index}"
