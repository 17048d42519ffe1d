"""A broker of a command's own (the demo's, the eval's): never one that agents may use.

* RabbitMQ: a vhost this run creates (it must not exist before) on the URL's node, through the
  local node's rabbitmqctl; `release()` deletes it with all it holds. A failover list
  (`amqp://...;amqp://...`) must name a private cluster of `devservices.rabbitmq_cluster` (its
  node 1's rabbitmqctl makes the vhost, which every node then serves).
* Redis: a database this run proves empty and claims in one step (a Lua script: DBSIZE is 0,
  then SET of a claim key naming the run); `release()` empties it only while the claim is
  still this run's. A database that is not empty is refused, whoever filled it.

A broker it cannot make its own is a `DevServicesError` whose message says what to do.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import redis

from memory_core.devservices.rabbitmq import (
    LOCAL_HOSTS,
    _rabbitmqctl,
    drop_vhost,
    rabbitmq_reachable,
    test_vhost,
    with_vhost,
)
from memory_core.devservices.rabbitmq_cluster import private_cluster_of
from memory_core.devservices.system import DevServicesError

CLAIM_KEY = "agent-memory:private-broker:claim"
# Claim an empty database atomically: {1} claimed, else {0, keys, claim or ""}.
_CLAIM = """
if redis.call('DBSIZE') == 0 then
  redis.call('SET', KEYS[1], ARGV[1])
  return {1}
end
local ok, claim = pcall(redis.call, 'GET', KEYS[1])
return {0, redis.call('DBSIZE'), (ok and claim) or ''}
"""
# Empty the database while the claim is this run's: keys removed, or -1 (not ours: untouched).
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local keys = redis.call('KEYS', '*')
for i = 1, #keys, 500 do
  redis.call('DEL', unpack(keys, i, math.min(i + 499, #keys)))
end
return #keys - 1
"""


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or ''}{parts.path or '/'}"


@dataclass
class PrivateBroker:
    url: str
    why: str  # for the user: which broker this is and why it is the run's own
    vhost: str | None = None
    claim: str | None = None
    rabbitmqctl: Sequence[str] = ()  # the command that reaches the vhost's node
    released: bool = field(default=False)

    def release(self) -> str:
        """Give it back: drop the vhost, or empty the claimed database. Idempotent."""
        if self.released:
            return "released"
        if self.vhost is not None:
            drop_vhost(self.vhost, rabbitmqctl=self.rabbitmqctl)
            self.released = True
            return f"deleted vhost {self.vhost}"
        client = redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=10)
        try:
            removed = int(client.eval(_RELEASE, 1, CLAIM_KEY, self.claim or ""))
        finally:
            client.close()
        self.released = True
        if removed < 0:
            return f"left {_where(self.url)} untouched (its claim is no longer this run's)"
        return f"emptied {_where(self.url)} ({removed} keys of this run)"


def claim_redis_db(url: str, run_id: str, why: str) -> PrivateBroker:
    """The database of `url`, claimed for `run_id` if it is empty; else DevServicesError."""
    claim = f"run {run_id}, pid {os.getpid()} on {socket.gethostname()}"
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)
    try:
        answer = client.eval(_CLAIM, 1, CLAIM_KEY, claim)
    finally:
        client.close()
    if int(answer[0]) == 1:
        return PrivateBroker(url, f"{why}; empty, claimed for this run", claim=claim)
    keys, holder = int(answer[1]), answer[2]
    holder = holder.decode() if isinstance(holder, bytes) else str(holder)
    whose = f"claimed by another demo or eval: {holder}" if holder else "not this run's"
    db = urlsplit(url).path.lstrip("/") or "0"
    raise DevServicesError(
        f"the broker {_where(url)} is not empty ({keys} keys, {whose}): the demo runs only on a "
        f"broker of its own; point CELERY_BROKER_URL at an empty Redis database, or empty db "
        f"{db} if nothing uses it"
    )


def create_vhost(url: str, run_id: str, *, search: Path | None = None) -> PrivateBroker:
    """A new vhost for `run_id` on the local RabbitMQ node behind `url`, or on the private
    cluster under `search` that a failover list names; else DevServicesError."""
    if ";" in url:
        return _cluster_vhost(url, run_id, search)
    host = urlsplit(url).hostname or ""
    if host not in LOCAL_HOSTS:
        raise DevServicesError(
            f"the demo runs on a RabbitMQ vhost of its own, made with rabbitmqctl on the local "
            f"node; {host} is not local: unset CELERY_BROKER_URL (the demo then uses Redis)"
        )
    name = _new_vhost_name(run_id)
    own = test_vhost(url, name)
    broker = PrivateBroker(own, f"vhost {name} made for this run, deleted at the end", vhost=name)
    try:
        if not rabbitmq_reachable(own):  # rabbitmqctl's node is not the URL's
            raise DevServicesError(f"RabbitMQ does not answer at {_where(own)}")
    except DevServicesError as exc:
        broker.release()
        raise DevServicesError(
            f"{exc}: the local rabbitmqctl reaches another node than CELERY_BROKER_URL"
        ) from None
    return broker


def _new_vhost_name(run_id: str, ctl: Sequence[str] = ()) -> str:
    """The run's vhost name, refused if the node (`ctl`: its rabbitmqctl) has it already."""
    name = f"agent_memory_demo_{run_id}"
    if name in _rabbitmqctl(["list_vhosts", "--no-table-headers", "name"], ctl).split():
        raise DevServicesError(f"RabbitMQ vhost {name} exists already: not this run's")
    return name


def _cluster_vhost(url: str, run_id: str, search: Path | None) -> PrivateBroker:
    cluster = private_cluster_of(url, search) if search is not None else None
    if cluster is None:
        raise DevServicesError(
            "CELERY_BROKER_URL is a failover list, and the demo runs only on a vhost of its own: "
            "it makes one on a private cluster of `python -m memory_core.devservices "
            "--rabbitmq-cluster` only, and these nodes are not one that is running"
        )
    ctl = cluster.nodes[0].rabbitmqctl
    name = _new_vhost_name(run_id, ctl)
    first, *rest = url.split(";")
    own = ";".join([test_vhost(first, name, rabbitmqctl=ctl), *(with_vhost(u, name) for u in rest)])
    why = f"vhost {name} on a private {len(cluster.nodes)}-node cluster, deleted at the end"
    return PrivateBroker(own, why, vhost=name, rabbitmqctl=tuple(ctl))
