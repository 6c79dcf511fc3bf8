"""The Python renderer of the Kustomize subset deploy/k8s uses (``support.kustomize``),
checked against ``kubectl kustomize`` where kubectl is installed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.support.kustomize import (
    OVERLAYS,
    by_identity,
    config_map_hash,
    has_kubectl,
    kubectl_kustomize,
    kustomize,
    operator_k8s_dir,
)


@pytest.mark.skipif(not has_kubectl(), reason="kubectl is not installed: nothing to compare with")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_python_renderer_gives_the_objects_kubectl_kustomize_gives(overlay: str) -> None:
    path = operator_k8s_dir() / "overlays" / overlay
    ours, theirs = by_identity(kustomize(path)), by_identity(kubectl_kustomize(path))
    assert sorted(ours) == sorted(theirs)
    for identity, obj in theirs.items():
        assert ours[identity] == obj, identity


def test_renderer_refuses_a_kustomize_feature_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("images:\n  - {name: fairq, newTag: '2'}\n")
    with pytest.raises(NotImplementedError, match="images"):
        kustomize(tmp_path)


def test_config_map_rename_reaches_the_pods_that_mount_it(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("x: 1\n")
    (tmp_path / "pod.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "d"},
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [{"name": "c"}],
                            "volumes": [{"name": "v", "configMap": {"name": "cfg"}}],
                        }
                    }
                },
            }
        )
    )
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [pod.yaml]\nconfigMapGenerator:\n  - {name: cfg, files: [a.yaml]}\n"
    )
    objects = by_identity(kustomize(tmp_path))
    config_map = next(o for o in objects.values() if o["kind"] == "ConfigMap")
    deployment = next(o for o in objects.values() if o["kind"] == "Deployment")
    assert config_map["metadata"]["name"].startswith("cfg-")
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    changed = copy.deepcopy(config_map)
    changed["data"]["a.yaml"] = "x: 2\n"
    assert f"cfg-{config_map_hash(changed)}" != config_map["metadata"]["name"]
