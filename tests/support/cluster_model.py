"""`ClusterMemoryMachine`: the model-based test's machine (tests/support/memory_model.py) on a
Redis Cluster, with the cluster's faults as its Redis rules: a primary killed -9 (its slots
without a primary until the replica takes over: connection refused, CLUSTERDOWN), a slot half
migrated (ASK, TRYAGAIN), and recovery. Every other rule and every invariant is the single
server's: the promises are the same."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.support.cluster_faults import FaultyCluster
from tests.support.memory_model import MemoryMachine


class ClusterMemoryMachine(MemoryMachine):
    @property
    def cluster(self) -> FaultyCluster:
        assert isinstance(self.w.redis, FaultyCluster)
        return self.w.redis

    def _key(self, i: int) -> str:
        return self.memory.copy.keys(self.threads[i].tid)[0]

    @rule(i=st.integers(0, 1))
    def redis_fault(self, i: int) -> None:
        self.cluster.kill_primary(self._key(i))

    @rule(i=st.integers(0, 1))
    def slot_migrating(self, i: int) -> None:
        self.cluster.start_migration(self._key(i))

    @rule()
    def redis_recovers(self) -> None:
        self.cluster.up()
