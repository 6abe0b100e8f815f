"""The cluster's part of /rayfleet/status: one read at a time, given up on in time, so
that `rayfleet status` answers while a node is lost or Serve's controller is busy."""

from __future__ import annotations

import asyncio
from typing import Any

from rayfleet.control.deploy import ClusterStatus


class SlowCluster:
    """A cluster read that takes ``delay_s``; counts how often it was asked."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.reads = 0

    async def __call__(self) -> dict[str, Any]:
        self.reads += 1
        await asyncio.sleep(self.delay_s)
        return {"nodes": [{"node_id": "n1"}], "applications": {}}


def test_a_read_in_time_is_the_cluster_state():
    async def main() -> dict[str, Any]:
        return await ClusterStatus(timeout_s=1.0, read=SlowCluster(0.0)).read()

    assert asyncio.run(main()) == {"nodes": [{"node_id": "n1"}], "applications": {}}


def test_a_slow_cluster_gives_an_error_in_time_and_is_asked_once_meanwhile():
    async def main() -> tuple[list[dict[str, Any]], float, int]:
        loop = asyncio.get_running_loop()
        cluster = SlowCluster(0.5)
        status = ClusterStatus(timeout_s=0.05, read=cluster)
        started = loop.time()
        late = await asyncio.gather(*(status.read() for _ in range(3)))
        late.append(await status.read())  # the first read is still under way
        took_s = loop.time() - started
        return late, took_s, cluster.reads

    late, took_s, reads = asyncio.run(main())
    assert all("did not report within 0.05 s" in answer["status_error"] for answer in late)
    assert took_s < 0.5, took_s  # not held until the cluster answered
    assert reads == 1
