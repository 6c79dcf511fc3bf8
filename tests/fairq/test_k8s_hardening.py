"""The pods as shipped: none privileged, the engines' API behind a key that the workers
send, and a Redis image that is pinned and not a release with known remote code
execution."""

from __future__ import annotations

import re

import pytest

from tests.fairq.test_k8s_manifests import named, of_kind, pod_specs, rendered
from tests.support.kustomize import OVERLAYS

Obj = dict[str, object]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_container_runs_as_root_or_may_gain_privileges(overlay: str) -> None:
    for workload, pod in pod_specs(rendered(overlay)):
        pod_security = pod.get("securityContext", {})
        assert pod_security.get("seccompProfile") == {"type": "RuntimeDefault"}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            security = container.get("securityContext", {})
            non_root = security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
            assert non_root is True, f"{where} may run as root"
            assert security.get("allowPrivilegeEscalation") is False, where
            assert security.get("capabilities", {}).get("drop") == ["ALL"], where
            assert security.get("readOnlyRootFilesystem") is True, where
            assert not security.get("privileged", False), where


def _secret_ref(container: Obj, name: str) -> tuple[str, str]:
    (item,) = [e for e in container["env"] if e["name"] == name]  # type: ignore[attr-defined]
    ref = item["valueFrom"]["secretKeyRef"]
    assert not ref.get("optional"), f"{name} must not start without its key"
    return ref["name"], ref["key"]


@pytest.mark.parametrize("overlay", ["production", "external-redis"])
def test_vllm_requires_the_key_the_workers_send_and_no_argv_holds_it(overlay: str) -> None:
    objects = rendered(overlay)
    engines = [
        container
        for _, pod in pod_specs(objects)
        for container in pod["containers"]
        if container["name"] == "vllm"
    ]
    (worker,) = named(objects, "Deployment", "worker")["spec"]["template"]["spec"]["containers"]
    sent = _secret_ref(worker, "FAIRQ_ENGINE_API_KEY")
    assert engines
    for container in engines:
        assert _secret_ref(container, "VLLM_API_KEY") == sent  # vLLM reads it as --api-key
        assert "--api-key" not in container["args"], "argv is readable by any process"
    secret = named(objects, "Secret", sent[0])
    assert sent[1] in {**secret.get("data", {}), **secret.get("stringData", {})}


def test_vllm_writes_only_to_its_own_volumes() -> None:
    for _, pod in pod_specs(rendered("production")):
        for container in pod["containers"]:
            if container["name"] != "vllm":
                continue
            env = {e["name"]: e.get("value") for e in container["env"]}
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            for path in (env["HOME"], env["HF_HOME"], "/tmp", "/dev/shm"):
                assert path in mounts, f"{path} is not writable with a read-only root"
            assert env["USER"], "torch's caches ask getpass.getuser() for an unlisted uid"


# The first release of each Redis line with every remote code execution fixed that was
# published up to August 2026 (redis.io release notes): the Lua ones CVE-2024-31449
# (7.4.1), CVE-2024-46981 (7.4.2), CVE-2025-49844 (7.4.6), CVE-2026-23631 (7.4.9), and
# those of RESTORE and RDB loading (7.4.10, 7.4.11); CVE-2025-21605 (7.4.3), a denial of
# service without authentication. 7.2 has no release with the 2026 fixes: none of it
# passes, nor does a line not listed.
PATCHED = {(7, 4): (7, 4, 11), (8, 2): (8, 2, 9), (8, 4): (8, 4, 6), (8, 6): (8, 6, 6)}
_IMAGE = re.compile(
    r"^(docker\.io/)?(library/)?redis:(?P<version>\d+\.\d+\.\d+)(-alpine[\d.]*)?"
    r"@sha256:[0-9a-f]{64}$"
)


def _redis_image_problem(image: str) -> str | None:
    match = _IMAGE.match(image)
    if match is None:
        return f"{image}: not redis:X.Y.Z[-alpine] pinned by @sha256 digest"
    version = tuple(int(part) for part in match["version"].split("."))
    fixed = PATCHED.get(version[:2])
    if fixed is None or version < fixed:
        return f"{image}: a Redis release with public remote code execution CVEs"
    return None


@pytest.mark.parametrize("overlay", ["production", "simulator"])
def test_redis_is_a_patched_release_pinned_by_digest(overlay: str) -> None:
    (redis,) = of_kind(rendered(overlay), "StatefulSet")
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert _redis_image_problem(container["image"]) is None


@pytest.mark.parametrize(
    "image",
    [
        "redis:7.2.5-alpine",  # as shipped before: Lua RCEs, and no digest
        "redis:7.4.11-alpine",  # a tag alone can be pushed again
        "redis:7.4.9-alpine@sha256:" + "0" * 64,  # before the RESTORE fixes
        "redis:7.2.12-alpine@sha256:" + "0" * 64,  # a line without the 2026 fixes
    ],
)
def test_the_redis_image_check_refuses_a_vulnerable_or_unpinned_image(image: str) -> None:
    assert _redis_image_problem(image) is not None
