"""The memory inspector in the deployments: compose's `inspector` profile and the kustomize
Component deploy/inspector/, both off by default, validated offline and parsed by the real CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from memory_core import cli
from tests.test_deploy_manifests import COMPOSE_FILE, DEPLOY, K8S_VERSION, KUSTOMIZATION

COMPONENT = DEPLOY / "inspector"
NAMESPACE = "agent-memory"
DOCS = [
    (p.name, d)
    for p in sorted(COMPONENT.glob("*.yaml"))
    if p.name != "kustomization.yaml"
    for d in yaml.safe_load_all(p.read_text())
    if d
]


def serve_params(argv: list[str]) -> dict[str, Any]:
    """Parse `agent-memory inspect serve ...` with the real CLI, without running it."""
    group = typer.main.get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup)
    assert argv[:2] == ["inspect", "serve"], argv
    inspect = group.commands["inspect"]
    assert isinstance(inspect, typer.core.TyperGroup)
    with inspect.commands["serve"].make_context("serve", argv[2:]) as ctx:
        return dict(ctx.params)


def one(kind: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCS if d["kind"] == kind]
    return doc


def test_compose_inspector_is_a_profile_with_its_credentials_from_the_environment() -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    svc = compose["services"]["inspector"]
    assert svc["profiles"] == ["inspector"]  # `docker compose up` alone does not start it
    assert serve_params(svc["command"]) == {"host": "0.0.0.0", "port": 8377}
    # Required, but not by `:?`: that would fail `docker compose up` without the profile too.
    # The command itself refuses in one line naming the variable (tests/inspector/).
    assert svc["environment"]["MEMORY_INSPECTOR_AUTH"] == "${MEMORY_INSPECTOR_AUTH:-}"
    assert svc["ports"] == ["127.0.0.1:${INSPECTOR_PORT:-8377}:8377"]  # loopback on the host
    assert "8377/healthz" in " ".join(svc["healthcheck"]["test"])
    assert "rabbitmq" not in svc["depends_on"]  # it reads Postgres and Redis only


def test_the_component_is_off_by_default_and_lists_its_files() -> None:
    k = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert (k["apiVersion"], k["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    assert set(k["resources"]) == {p.name for p in COMPONENT.glob("*.yaml")} - {
        "kustomization.yaml"
    }
    base = yaml.safe_load(KUSTOMIZATION.read_text())
    assert "inspector" not in (base.get("components") or [])
    assert "#   - inspector" in KUSTOMIZATION.read_text()  # the base says how to turn it on
    assert all(d["metadata"]["namespace"] == NAMESPACE for _, d in DOCS)


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=[d["kind"] for _, d in DOCS])
def test_manifest_validates(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_deployment_serves_on_a_cluster_internal_service_with_auth_from_a_secret() -> None:
    dep = one("Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["agent-memory"]
    assert serve_params(c["args"]) == {"host": "0.0.0.0", "port": 8377}
    (env,) = c["env"]
    ref = env["valueFrom"]["secretKeyRef"]
    secret = one("Secret")
    assert (env["name"], ref["name"]) == ("MEMORY_INSPECTOR_AUTH", secret["metadata"]["name"])
    user, _, password = secret["stringData"][ref["key"]].partition(":")
    assert user and password  # user:password, to be replaced
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"  # the route without auth
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    svc = one("Service")
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 8377 and port["targetPort"] == c["ports"][0]["name"]


def test_kustomize_builds_deploy_with_the_component(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its `kustomize` builds the overlay)")
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    with (tmp_path / "deploy" / "kustomization.yaml").open("a") as k:
        k.write("\ncomponents:\n  - inspector\n")
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "deploy")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    built = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    dep = built[("Deployment", "agent-memory-inspector")]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"].startswith("registry.example.com/agent-memory")  # the base's image
    assert ("Service", "agent-memory-inspector") in built
    assert ("Secret", "agent-memory-inspector") in built
