"""A caller on another node than the model gateway makes Ray actor calls; one on the gateway's
node uses its socket. Run by test_local_channel.py in a simulated two-node cluster of its own
(``ray.cluster_utils.Cluster``: one Ray per process, so not in the test session's), and prints
one JSON line of findings.

    CANOPY_DATABASE_URL=... python -m tests.actors.multinode_scenario
"""

from __future__ import annotations

import json
import uuid

import ray
from ray.cluster_utils import Cluster

from actors.gateway_actor import GatewayActor
from actors.scripted import say
from tests.actors.helpers import channel_caller, model_request


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"gateway_node": 1}})
    cluster.add_node(num_cpus=1, resources={"other_node": 1})
    ray.init(address=cluster.address)
    try:
        gateway = GatewayActor.options(num_cpus=0, resources={"gateway_node": 0.01}).remote(
            timeout_seconds=30, retries=0)
        findings = {}
        for node in ("gateway_node", "other_node"):
            caller = channel_caller().options(resources={node: 0.01}).remote(gateway)
            reply = ray.get(caller.call.remote(**model_request(str(uuid.uuid4()), say(f"from {node}"))))
            findings[node] = {"reply": reply["message"]["content"], "transport": ray.get(caller.transport.remote())}
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("FINDINGS " + json.dumps(findings), flush=True)


if __name__ == "__main__":
    main()
