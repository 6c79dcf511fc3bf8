"""``fairq k8s render`` and ``fairq k8s add-key`` as an operator runs them: the API-key
Secret of the production overlays rendered from the configuration (hashes only), or none
and a note naming the command that makes a key; from any directory, and unchanged files
reported as unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker import Settings, hash_key
from fairq.k8s import render as k8s
from fairq.stack.processes import demo_api_keys
from tests.support.cli import fairq
from tests.support.kustomize import K8S_DIR, kustomize, operator_checkout

SOURCE = K8S_DIR / "fairq.yaml"
KEYS_SECRET = Path("components/api-keys/api-keys.yaml")


def _source_without_keys() -> str:
    """deploy/k8s/fairq.yaml as it ships: its comments, and no api_keys."""
    text = SOURCE.read_text()
    assert "api_keys" not in yaml.safe_load(text)
    return text


def _secret_entries(k8s_dir: Path) -> list[dict[str, Any]]:
    secret = yaml.safe_load((k8s_dir / KEYS_SECRET).read_text())
    assert (secret["kind"], secret["metadata"]["name"]) == ("Secret", "fairq-api-keys")
    entries: list[dict[str, Any]] = json.loads(secret["stringData"]["api_keys.json"])
    return entries


def test_the_simulators_first_apply_accepts_the_demo_keys_of_fairq_up() -> None:
    objects = kustomize(K8S_DIR / "overlays" / "simulator")
    (secret,) = [
        o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "fairq-api-keys"
    ]
    entries = json.loads(secret["stringData"]["api_keys.json"])
    assert entries == demo_api_keys()
    settings = Settings(api_keys=entries)  # as the gateway reads FAIRQ_API_KEYS
    assert hash_key("fq-demo-alice") in {k.sha256 for k in settings.api_keys}


def test_without_keys_render_says_the_production_overlays_cannot_build(tmp_path: Path) -> None:
    k8s_dir = operator_checkout(tmp_path / "k8s")  # every secrets file written
    (k8s_dir / "fairq.yaml").write_text(_source_without_keys())
    done = fairq("k8s", "render", "--dir", str(k8s_dir))
    assert done.returncode == 0, done.stderr
    assert f"removed   {k8s_dir / KEYS_SECRET}" in done.stdout.splitlines()
    assert "lists no api_keys" in done.stderr and "no request would be accepted" in done.stderr
    assert f"fairq k8s add-key USER --dir {k8s_dir}" in done.stderr
    with pytest.raises(FileNotFoundError, match=r"api-keys\.yaml"):
        kustomize(k8s_dir / "overlays" / "production")
    assert kustomize(k8s_dir / "overlays" / "simulator")


def test_render_refuses_a_key_in_the_clear(tmp_path: Path) -> None:
    source = yaml.safe_load(SOURCE.read_text())
    source["api_keys"] = [{"key": "fq-secret", "user": "eve"}]
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump(source))
    done = fairq("k8s", "render", "--dir", str(tmp_path))
    assert done.returncode == 2
    assert "api_keys[0] holds a key in the clear" in done.stderr
    assert "fq-secret" not in done.stderr + done.stdout


def test_add_key_prints_the_key_once_and_render_puts_only_its_hash_in_the_secret(
    tmp_path: Path,
) -> None:
    (tmp_path / "fairq.yaml").write_text(_source_without_keys())
    done = fairq("k8s", "add-key", "bob", "--tenant", "team-b", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    key = done.stdout.splitlines()[0].rsplit(" ", 1)[-1]
    assert key.startswith("fq-") and len(key) > 30
    text = (tmp_path / "fairq.yaml").read_text()
    assert key not in text and hash_key(key) in text
    assert text.startswith(_source_without_keys())  # the comments are kept

    rendered = fairq("k8s", "render", "--dir", str(tmp_path))
    assert rendered.returncode == 0, rendered.stderr
    assert _secret_entries(tmp_path) == [
        {"sha256": hash_key(key), "user": "bob", "tenant": "team-b"}
    ]
    assert key not in (tmp_path / KEYS_SECRET).read_text()
    assert "lists no api_keys" not in rendered.stderr


def test_add_key_appends_to_a_list_of_keys_and_keeps_the_file_as_written(tmp_path: Path) -> None:
    shutil.copy(SOURCE, tmp_path / "fairq.yaml")
    made = []
    for user in ("ops", "eve"):
        done = fairq("k8s", "add-key", user, "--admin", "--dir", str(tmp_path))
        assert done.returncode == 0, done.stderr
        made.append(done.stdout.splitlines()[0].rsplit(" ", 1)[-1])
    after = yaml.safe_load((tmp_path / "fairq.yaml").read_text())["api_keys"]
    assert after == [
        {"sha256": hash_key(key), "user": user, "admin": True}
        for key, user in zip(made, ("ops", "eve"), strict=True)
    ]
    assert (tmp_path / "fairq.yaml").read_text().startswith(SOURCE.read_text())


def test_render_runs_from_any_directory(tmp_path: Path) -> None:
    for cwd in (tmp_path, K8S_DIR / "engines" / "vllm", K8S_DIR.parent.parent / "docs"):
        done = fairq("k8s", "render", "--check", cwd=cwd)
        assert done.returncode == 0, (cwd, done.stderr)


def test_render_reports_unchanged_files_as_unchanged(tmp_path: Path) -> None:
    k8s_dir = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, k8s_dir)
    done = fairq("k8s", "render", "--dir", str(k8s_dir))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith("unchanged ") for line in lines), lines
    assert "lists no api_keys" in done.stderr  # none ships

    source = yaml.safe_load((k8s_dir / "fairq.yaml").read_text())
    source["models"][1]["k8s"] |= {"max_replicas": 2, "drain_timeout_s": 300}
    (k8s_dir / "fairq.yaml").write_text(yaml.safe_dump(source, sort_keys=False))
    stamp = (k8s_dir / "overlays/simulator/demo-secrets.yaml").stat().st_mtime_ns
    done = fairq("k8s", "render", "--dir", str(k8s_dir))
    lines = done.stdout.splitlines()
    wrote = sorted(line.split()[-1] for line in lines if line.startswith("wrote"))
    assert wrote == sorted(
        str(k8s_dir / p)
        for p in (
            "components/engine-scaling/scaledobjects.yaml",
            "engines/sim/qwen2-5-coder-7b.yaml",
            "engines/vllm/qwen2-5-coder-7b.yaml",
        )
    )
    assert (k8s_dir / "overlays/simulator/demo-secrets.yaml").stat().st_mtime_ns == stamp


def test_switching_the_engine_trigger_to_prometheus_removes_the_scaler_and_back(
    tmp_path: Path,
) -> None:
    k8s_dir = operator_checkout(tmp_path / "k8s")
    source = yaml.safe_load((k8s_dir / "fairq.yaml").read_text())
    source["k8s"]["engine_trigger"] = "prometheus"
    (k8s_dir / "fairq.yaml").write_text(yaml.safe_dump(source, sort_keys=False))
    done = fairq("k8s", "render", "--dir", str(k8s_dir))
    assert done.returncode == 0, done.stderr
    removed = {f"removed   {k8s_dir / p}" for p in k8s.SCALER_AND_CERTS}
    assert removed <= set(done.stdout.splitlines())
    kinds = {(o["kind"], o["metadata"]["name"]) for o in kustomize(k8s_dir / "overlays/production")}
    assert ("Deployment", "keda-scaler") not in kinds and ("Deployment", "dispatcher") in kinds

    source["k8s"]["engine_trigger"] = "external-push"
    (k8s_dir / "fairq.yaml").write_text(yaml.safe_dump(source, sort_keys=False))
    assert fairq("k8s", "render", "--dir", str(k8s_dir)).returncode == 0
    kinds = {(o["kind"], o["metadata"]["name"]) for o in kustomize(k8s_dir / "overlays/production")}
    assert {("Deployment", "keda-scaler"), ("Service", "keda-scaler")} <= kinds


def test_an_unknown_engine_trigger_is_refused_naming_the_choices(tmp_path: Path) -> None:
    source = yaml.safe_load(SOURCE.read_text())
    source["k8s"]["engine_trigger"] = "push"
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump(source))
    done = fairq("k8s", "render", "--dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "engine_trigger" in done.stderr and "'external-push' or 'prometheus'" in done.stderr
