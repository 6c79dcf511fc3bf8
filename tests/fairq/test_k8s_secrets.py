"""No known secret can deploy: the demo keys and passwords live in the simulator overlay
only, a production overlay builds only from what its operator writes, and ``fairq k8s
render`` refuses a known secret anywhere else, naming the line to change."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from broker import hash_key
from fairq.k8s import keys as k8s_keys
from fairq.k8s.secrets import DEMO_ENGINE_KEY, DEMO_REDIS_PASSWORD, PLACEHOLDERS
from fairq.stack.processes import DEMO_ADMIN_KEY, DEMO_KEYS
from tests.support.cli import fairq
from tests.support.kustomize import (
    K8S_DIR,
    OPERATOR_ENGINE_KEY,
    OPERATOR_KEY_ENTRY,
    OPERATOR_REDIS_PASSWORD,
    OVERLAYS,
    has_kubectl,
    kubectl_kustomize,
    kustomize,
    operator_checkout,
    operator_k8s_dir,
)

PRODUCTION_OVERLAYS = [o for o in OVERLAYS if o != "simulator"]
KNOWN = {hash_key(k) for k in (*DEMO_KEYS, DEMO_ADMIN_KEY)} | {
    DEMO_REDIS_PASSWORD, DEMO_ENGINE_KEY, *PLACEHOLDERS, "REPLACE-ME",
}  # fmt: skip
Obj = dict[str, Any]


def _render(path: Path) -> list[Obj]:
    return kubectl_kustomize(path) if has_kubectl() else kustomize(path)


def _secret_values(objects: list[Obj]) -> dict[tuple[str, str], str]:
    """(Secret, key) -> value, base64 decoded."""
    values = {}
    for obj in objects:
        if obj["kind"] == "Secret":
            for key, value in obj.get("stringData", {}).items():
                values[obj["metadata"]["name"], key] = value
            for key, value in obj.get("data", {}).items():
                values[obj["metadata"]["name"], key] = base64.b64decode(value).decode()
    return values


def _known_in(values: dict[tuple[str, str], str]) -> set[str]:
    """The known secrets among the values: as they are, a URL's password, a key's hash."""
    found = set()
    for (_, key), value in values.items():
        candidates = {value}
        if key == "url":
            candidates.add(urlsplit(value).password or "")
        if key == "api_keys.json":
            candidates |= {entry["sha256"] for entry in json.loads(value)}
        found |= candidates & KNOWN
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_simulator_overlay_deploys_a_known_secret(overlay: str) -> None:
    values = _secret_values(_render(operator_k8s_dir() / "overlays" / overlay))
    assert {name for name, _ in values} == {"fairq-api-keys", "fairq-redis", "fairq-engine"}
    known = _known_in(values)
    if overlay == "simulator":
        assert hash_key(DEMO_ADMIN_KEY) in known and DEMO_REDIS_PASSWORD in known
    else:
        assert known == set(), f"{overlay} deploys a secret everybody knows"


def test_the_base_holds_no_secret() -> None:
    assert [o for o in kustomize(K8S_DIR / "base") if o["kind"] == "Secret"] == []


@pytest.mark.parametrize("overlay", PRODUCTION_OVERLAYS)
def test_a_production_overlay_does_not_build_until_its_operator_writes_its_secrets(
    overlay: str,
) -> None:
    with pytest.raises(FileNotFoundError):
        kustomize(K8S_DIR / "overlays" / overlay)
    if has_kubectl():
        with pytest.raises(subprocess.CalledProcessError) as failed:
            kubectl_kustomize(K8S_DIR / "overlays" / overlay)
        assert "secrets/redis.env" in failed.value.stderr


@pytest.mark.parametrize("overlay", PRODUCTION_OVERLAYS)
def test_a_production_overlays_secrets_are_the_ones_its_operator_wrote(overlay: str) -> None:
    values = _secret_values(_render(operator_k8s_dir() / "overlays" / overlay))
    assert OPERATOR_REDIS_PASSWORD in values["fairq-redis", "url"]
    assert values.get(("fairq-redis", "password"), OPERATOR_REDIS_PASSWORD) == (
        OPERATOR_REDIS_PASSWORD
    )
    assert values["fairq-engine", "api_key"] == OPERATOR_ENGINE_KEY
    assert json.loads(values["fairq-api-keys", "api_keys.json"]) == [OPERATOR_KEY_ENTRY]


def test_the_operators_secrets_files_are_never_committed() -> None:
    for overlay in PRODUCTION_OVERLAYS:
        for name in ("redis.env", "engine.env"):
            path = K8S_DIR / "overlays" / overlay / "secrets" / name
            ignored = subprocess.run(
                ["git", "check-ignore", "-q", str(path)], cwd=K8S_DIR, check=False
            )
            assert ignored.returncode == 0, f"{path} would be committed"
            assert (path.parent / f"{name}.example").is_file(), "an example shows the format"


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_render_refuses_a_demo_keys_hash_naming_the_line_to_delete(tmp_path: Path) -> None:
    k8s_dir = operator_checkout(tmp_path / "k8s")
    demo = {"sha256": hash_key(DEMO_ADMIN_KEY), "user": "admin", "admin": True}
    k8s_keys.add_key(k8s_dir / "fairq.yaml", demo)
    before = (k8s_dir / "components/api-keys/api-keys.yaml").read_text()
    for check in ([], ["--check"]):
        done = fairq("k8s", "render", *check, "--dir", str(k8s_dir))
        assert done.returncode == 2, done.stderr
        line = _line_of(k8s_dir / "fairq.yaml", demo["sha256"])
        assert f"{k8s_dir}/fairq.yaml:{line}: the hash of the public demo key " in done.stderr
        assert "delete this entry" in done.stderr and "fairq k8s add-key USER" in done.stderr
    assert (k8s_dir / "components/api-keys/api-keys.yaml").read_text() == before, "no write"


@pytest.mark.parametrize(
    ("password", "what"),
    [
        ("change-me", "the placeholder 'change-me'"),
        ("REPLACE-ME", "the placeholder 'replace-me'"),  # the example, copied as it is
        (DEMO_REDIS_PASSWORD, "the simulator's public demo Redis password"),
    ],
)
def test_render_refuses_a_known_password_in_an_operators_secrets_naming_the_line(
    tmp_path: Path, password: str, what: str
) -> None:
    k8s_dir = operator_checkout(tmp_path / "k8s")
    env = k8s_dir / "overlays/production/secrets/redis.env"
    env.write_text(f"# mine\npassword={password}\nurl=redis://:{password}@redis:6379/0\n")
    done = fairq("k8s", "render", "--dir", str(k8s_dir))
    assert done.returncode == 2
    shown = f"{k8s_dir}/overlays/production/secrets/redis.env"
    assert f"{shown}:2: {what}: write a secret of your own here" in done.stderr
    assert f"{shown}:3: {what}" in done.stderr


def test_render_refuses_a_redis_url_whose_password_is_not_the_servers(tmp_path: Path) -> None:
    k8s_dir = operator_checkout(tmp_path / "k8s")
    env = k8s_dir / "overlays/production/secrets/redis.env"
    env.write_text("password=a1b2c3d4e5f6a7b8\nurl=redis://:a1b2c3d4e5f6a7b9@redis:6379/0\n")
    done = fairq("k8s", "render", "--dir", str(k8s_dir))
    assert done.returncode == 2
    assert "redis.env:2: the password in url is not the one of password= (line 1)" in done.stderr


def test_render_refuses_the_old_placeholder_secret_left_in_the_base(tmp_path: Path) -> None:
    k8s_dir = operator_checkout(tmp_path / "k8s")
    old = "stringData:\n  password: change-me\n  url: redis://:change-me@redis:6379/0\n"
    (k8s_dir / "base" / "secrets.yaml").write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: fairq-redis}\n" + old
    )
    done = fairq("k8s", "render", "--dir", str(k8s_dir))
    assert done.returncode == 2
    assert f"{k8s_dir}/base/secrets.yaml:5: the placeholder 'change-me'" in done.stderr


def test_the_shipped_checkout_renders_and_its_demo_secrets_stay_in_the_simulator(
    tmp_path: Path,
) -> None:
    shutil.copytree(K8S_DIR, tmp_path / "k8s", ignore=shutil.ignore_patterns("*.env"))
    done = fairq("k8s", "render", "--check", "--dir", str(tmp_path / "k8s"))
    assert done.returncode == 0, done.stderr
