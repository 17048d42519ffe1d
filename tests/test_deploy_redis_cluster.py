"""deploy/redis-cluster/: the kustomize Component that runs the working copies and the event
streams on a six-pod Redis Cluster, validated offline and its parts run for real.

* Every manifest against the Kubernetes schemas (kubernetes-validate, strict), the pods
  against the namespace's `restricted` Pod Security Standard, and the shape: six pods, one
  replica per primary, a headless Service publishing not-ready pods, a PodDisruptionBudget.
* REDIS_URL as the library parses it (`cluster_seeds`, `Settings`): its seeds are the
  StatefulSet's pods under the Service, on the container's port.
* `kubectl kustomize` builds deploy/ with the component (where kubectl is installed).
* The ConfigMap's redis.conf runs in the system's redis-server, and the Job's script, run by
  `sh` against six such nodes on loopback addresses (127.0.0.11-16, their DNS names answered
  by a `getent` on PATH), creates a cluster of 3 primaries and 3 replicas that the library's
  client reads and writes; run again, it leaves the cluster as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis
import yaml

from memory_core.devservices.ports import free_port
from memory_core.io.redis_client import make_redis
from memory_core.io.redis_kinds import cluster_seeds
from memory_core.settings import Settings

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
COMPONENT = DEPLOY / "redis-cluster"
K8S_VERSION = "1.30.0"
NAMESPACE = "agent-memory"
PASSWORD = "s3cret-Pa55"


def load() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(COMPONENT.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


DOCS = load()


def one(kind: str, file: str = "redis-cluster.yaml") -> dict[str, Any]:
    (doc,) = [d for f, d in DOCS if d["kind"] == kind and f == file]
    return doc


def job_script() -> str:
    (c,) = one("Job")["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["sh", "-c"]
    (script,) = c["args"]
    return str(script)


def test_component_lists_its_files() -> None:
    k = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert (k["apiVersion"], k["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    listed = {*k["resources"], *(p["path"] for p in k["patches"])}
    assert listed == {p.name for p in COMPONENT.glob("*.yaml")} - {"kustomization.yaml"}
    assert all(d["metadata"]["namespace"] == NAMESPACE for _, d in DOCS)
    # The base says how to turn it on.
    assert "components:" in (DEPLOY / "kustomization.yaml").read_text()


@pytest.mark.parametrize(
    "doc", [d for _, d in DOCS], ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in DOCS]
)
def test_manifest_validates(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def pod_specs() -> list[dict[str, Any]]:
    return [one(kind)["spec"]["template"]["spec"] for kind in ("StatefulSet", "Job")]


def test_pods_meet_the_restricted_pod_security_standard() -> None:
    for pod in pod_specs():
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False
            assert csc["capabilities"]["drop"] == ["ALL"]
            assert "hostPort" not in str(c.get("ports", []))


def test_the_password_comes_from_the_secret_and_never_a_command_line() -> None:
    secret = one("Secret")
    for pod in pod_specs():
        for c in pod["containers"]:
            (ref,) = [e for e in c["env"] if e["name"] == "REDISCLI_AUTH"]
            key = ref["valueFrom"]["secretKeyRef"]
            assert key["name"] == secret["metadata"]["name"] and key["key"] in secret["stringData"]
            argv = " ".join([*c["command"], *c["args"]])
            assert " -a " not in argv and "--requirepass" not in argv


def test_six_pods_three_primaries_with_a_replica_each() -> None:
    sts, svc, pdb = one("StatefulSet"), one("Service"), one("PodDisruptionBudget")
    assert sts["spec"]["replicas"] == 6
    script = job_script()
    assert "--cluster-replicas 1" in script and "--cluster-yes" in script
    assert "nodes=6\n" in script  # the Job waits for every pod of the StatefulSet
    # 6 nodes, 1 replica each: 6 / (1 + 1) = 3 primaries (redis-cli's rule).
    pods = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    for selector in (svc["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= pods.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= pods.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == ports
    assert ports["cluster-bus"] == ports["redis"] + 10000  # Redis's default bus port
    (port_env,) = [
        e
        for e in one("Job")["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "REDIS_PORT"
    ]
    assert int(port_env["value"]) == ports["redis"]


def redis_conf() -> dict[str, str]:
    text = one("ConfigMap")["data"]["redis.conf"]
    pairs = [line.split(None, 1) for line in text.splitlines() if line.strip()]
    return {k: v for k, v in pairs}


def test_redis_conf_is_durable_never_evicts_and_announces_names() -> None:
    conf = redis_conf()
    assert conf["cluster-enabled"] == "yes"
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["cluster-preferred-endpoint-type"] == "hostname"
    (c,) = one("StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert "--cluster-announce-hostname" in c["args"][0]
    # Node identity and data live on the volume, not in the container.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert conf["dir"] == mounts["data"]
    assert conf["cluster-config-file"].startswith(mounts["data"] + "/")
    # maxmemory below the memory limit leaves room for the AOF rewrite fork.
    assert conf["maxmemory"] == "1gb"
    assert c["resources"]["limits"]["memory"] == "1536Mi"


def test_redis_url_names_the_pods_as_seeds() -> None:
    patch = one("Secret", "redis-url.yaml")
    base = yaml.safe_load((DEPLOY / "secret.yaml").read_text())
    assert patch["metadata"]["name"] == base["metadata"]["name"]
    assert patch["metadata"]["namespace"] == base["metadata"]["namespace"]
    assert set(patch["stringData"]) == {"REDIS_URL"}
    url = patch["stringData"]["REDIS_URL"]
    parsed = cluster_seeds(url)
    assert parsed.password == "REPLACE_ME" == one("Secret")["stringData"]["REDISCLI_AUTH"]
    sts, svc = one("StatefulSet"), one("Service")
    name, service = sts["metadata"]["name"], svc["metadata"]["name"]
    pods = {f"{name}-{i}.{service}.{NAMESPACE}.svc" for i in range(sts["spec"]["replicas"])}
    assert parsed.seeds and all(host in pods and port == 6379 for host, port in parsed.seeds)
    assert Settings(_env_file=None, redis_url=url).redis_url == url


def test_kustomize_builds_deploy_with_the_component(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its `kustomize` builds the overlay)")
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    with (tmp_path / "deploy" / "kustomization.yaml").open("a") as k:
        k.write("\ncomponents:\n  - redis-cluster\n")
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "deploy")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    built = [d for d in yaml.safe_load_all(out) if d]
    (secret,) = [d for d in built if d["metadata"]["name"] == "agent-memory-secrets"]
    assert secret["stringData"]["REDIS_URL"].startswith("redis+cluster://")
    assert secret["stringData"]["DATABASE_URL"]  # the patch merged, it did not replace
    ours = [d for d in built if d["metadata"]["name"].startswith("agent-memory-redis")]
    assert {d["kind"] for d in ours} == {d["kind"] for _, d in DOCS if d["kind"] != "Secret"} | {
        "Secret"
    }
    for d in ours:
        assert d["metadata"]["namespace"] == NAMESPACE
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "agent-memory"


# ---------------------------------------------------------------- the parts, run for real

GETENT = """#!/bin/sh
# getent hosts agent-memory-redis-N.agent-memory-redis.agent-memory.svc -> 127.0.0.(BASE+N)
[ "$1" = hosts ] || exit 2
case "$2" in
  agent-memory-redis-[0-5].agent-memory-redis.agent-memory.svc)
    n=${2#agent-memory-redis-}; n=${n%%.*}; echo "127.0.0.$((BASE + n))      $2";;
  *) exit 2;;
esac
"""


def addresses(base: int) -> list[str]:
    return [f"127.0.0.{base + i}" for i in range(6)]


def _port_pair() -> int:
    while True:
        port = free_port()
        if port + 10000 < 65536:
            return port


class Pods:
    """Six redis-servers with the ConfigMap's redis.conf, each on a loopback address of its
    own and one shared port (as pods are), password-protected as the container does it,
    each with its data folder (its volume), which outlives a restart on new addresses."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port, self.base = root, port, 0
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, base: int) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None
        self.base = base
        conf = one("ConfigMap")["data"]["redis.conf"]
        for i, addr in enumerate(addresses(base)):
            ndir = self.root / f"pod{i}"
            ndir.mkdir(exist_ok=True)
            # The ConfigMap's text with the volume's mount path mapped to this pod's folder
            # (Redis changes into `dir` as it reads it), then what differs for a process
            # beside others on one host: later directives win. A pod has one address; here
            # a connection from 127.0.0.N leaves from 127.0.0.1 unless told otherwise.
            (ndir / "redis.conf").write_text(
                conf.replace(" /data", f" {ndir}")
                + f"bind {addr}\nbind-source-addr {addr}\nport {self.port}\n"
                f"cluster-announce-hostname {addr}\n"
                f'requirepass "{PASSWORD}"\nmasterauth "{PASSWORD}"\n'
                f"logfile {ndir}/redis.log\n"
            )
            self.procs.append(subprocess.Popen([exe, str(ndir / "redis.conf")]))
        for addr in addresses(base):
            self._wait_for(addr)

    def _wait_for(self, addr: str) -> None:
        client = redis.Redis(addr, self.port, password=PASSWORD, socket_timeout=2)
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.BusyLoadingError):
                    if time.monotonic() > deadline:
                        logs = sorted(self.root.glob("pod*/redis.log"))
                        raise AssertionError(
                            "\n".join(p.read_text()[-500:] for p in logs)
                        ) from None
                    time.sleep(0.1)
        finally:
            client.close()

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=10)
        self.procs = []

    def nodes_table(self, pod: int = 0) -> list[dict[str, Any]]:
        node = redis.Redis(
            addresses(self.base)[pod], self.port, password=PASSWORD, decode_responses=True
        )
        try:
            return list(node.cluster("NODES").values())
        finally:
            node.close()

    def url(self) -> str:
        seeds = ",".join(f"{a}:{self.port}" for a in addresses(self.base)[:3])
        return f"redis+cluster://:{PASSWORD}@{seeds}"


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("the system's redis-server and redis-cli are needed")
    running = Pods(tmp_path, _port_pair())
    try:
        running.start(base=11)
        yield running
    finally:
        running.kill_all()


def run_job(tmp_path: Path, port: int, base: int) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "getent").write_text(GETENT)
    (bin_dir / "getent").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "BASE": str(base),
        "REDIS_PORT": str(port),
        "REDISCLI_AUTH": PASSWORD,
    }
    return subprocess.run(
        ["sh", "-c", job_script()],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def three_shards(table: list[dict[str, Any]], names: list[str]) -> bool:
    primaries = {n["node_id"] for n in table if "master" in n["flags"] and n["slots"]}
    replicas = [n["master_id"] for n in table if "slave" in n["flags"]]
    return (
        len(primaries) == 3
        and sorted(replicas) == sorted(primaries)
        # The nodes announce names (here: their addresses), which clients connect to.
        and sorted(n["hostname"] for n in table) == names
        and all(n["connected"] for n in table)
    )


def assert_settles_into_three_shards(pods: Pods) -> None:
    """cluster_state:ok (where the Job stops) means every slot is served; the replicas'
    roles and the announced names reach every node's table by gossip shortly after."""
    deadline = time.monotonic() + 30
    while not all(three_shards(pods.nodes_table(i), addresses(pods.base)) for i in range(6)):
        assert time.monotonic() < deadline, pods.nodes_table()
        time.sleep(0.2)


def test_job_creates_the_cluster_once_and_the_library_uses_it(pods: Pods, tmp_path: Path) -> None:
    first = run_job(tmp_path, pods.port, pods.base)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.rstrip().endswith("the cluster is up")
    assert_settles_into_three_shards(pods)
    client = make_redis(pods.url())
    try:
        # Keys of many threads spread over the three primaries, and each reads back.
        for n in range(30):
            client.set(f"test:{{t{n}}}:copy", str(n))
        assert [client.get(f"test:{{t{n}}}:copy") for n in range(30)] == [
            str(n).encode() for n in range(30)
        ]
        # Run again (a re-applied Job): it sees the cluster up and changes nothing.
        again = run_job(tmp_path, pods.port, pods.base)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.strip() == "the cluster is up"
        assert client.get("test:{t29}:copy") == b"29"
    finally:
        client.close()


def test_job_rejoins_the_nodes_after_all_restarted_on_new_addresses(
    pods: Pods, tmp_path: Path
) -> None:
    """The documented recovery from a cluster-wide restart: every pod back on a new IP, each
    nodes.conf naming the others' old ones. The Job introduces them again; data and slots are
    the ones they had (AOF and nodes.conf on the volume)."""
    created = run_job(tmp_path, pods.port, pods.base)
    assert created.returncode == 0, created.stdout + created.stderr
    assert_settles_into_three_shards(pods)
    client = make_redis(pods.url())
    for n in range(30):
        client.set(f"test:{{t{n}}}:copy", str(n))
    client.close()
    ids_before = sorted(n["node_id"] for n in pods.nodes_table())
    time.sleep(1.2)  # appendfsync everysec
    pods.kill_all()
    pods.start(base=21)
    rejoined = run_job(tmp_path, pods.port, pods.base)
    assert rejoined.returncode == 0, rejoined.stdout + rejoined.stderr
    assert "introducing them to each other again" in rejoined.stdout
    assert sorted(n["node_id"] for n in pods.nodes_table()) == ids_before
    # Here a pod's announced name is its address, so the new names still have to spread by
    # gossip (on Kubernetes the names stay and only the IPs behind them change).
    assert_settles_into_three_shards(pods)
    client = make_redis(pods.url())
    try:
        assert [client.get(f"test:{{t{n}}}:copy") for n in range(30)] == [
            str(n).encode() for n in range(30)
        ]
    finally:
        client.close()


def test_job_gives_up_naming_the_pod_that_never_answers(tmp_path: Path) -> None:
    """With no node at all the Job does not hang forever: shortened here by a `sleep` on
    PATH that returns at once, it exits 1 naming the first pod."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sleep").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sleep").chmod(0o755)
    result = run_job(tmp_path, free_port(), 11)
    assert result.returncode == 1
    assert "no answer from agent-memory-redis-0.agent-memory-redis.agent-memory.svc" in (
        result.stdout
    )
