"""At shutdown the fleet process stops, through Ray, the engine groups its replicas left
recorded on other nodes: a real cluster of two raylets on this machine, a stand-in
server whose engine core was orphaned (tests/unit/test_process_groups.py's)."""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster

from rayfleet.control.node_sweep import sweep_other_nodes
from rayfleet.control.process_groups import record_engine
from tests.integration.fleet import wait_until
from tests.unit.test_process_groups import running, start_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        other = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield other.node_id
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_group_recorded_on_another_node_is_stopped_there(two_nodes, tmp_path):
    server, orphan = start_server("exit", core_argv="untitled")
    try:
        record_engine(tmp_path, server.pid)
        server.wait(timeout=30)  # its replica was lost: the engine core is an orphan
        assert running(orphan)
        # Only the other node is asked: this process's own node is swept by the fleet
        # process itself, from its own disk.
        assert sweep_other_nodes(tmp_path, timeout_s=300) == {two_nodes: [server.pid]}
        assert wait_until(lambda: not running(orphan), 30)
        assert list(tmp_path.iterdir()) == []
        assert sweep_other_nodes(tmp_path, timeout_s=300) == {two_nodes: []}  # nothing left
    finally:
        if running(orphan):
            orphan.kill()
