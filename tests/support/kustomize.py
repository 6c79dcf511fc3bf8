"""A Python renderer of the Kustomize subset deploy/k8s uses (tests/fairq/test_k8s_kustomize.py
checks it against kubectl).

The manifest tests render every overlay with ``kubectl kustomize`` where kubectl is
installed and with this renderer elsewhere. It implements only what deploy/k8s uses,
and fails loudly on anything else: ``resources`` (files and directories),
``components``, ``configMapGenerator`` (``files``, with Kustomize's content-hash name
suffix and the rewriting of the references to it), ``secretGenerator`` (``envs``, with
``generatorOptions.disableNameSuffixHash``), ``namespace``, ``labels``
(``includeSelectors: false``) and JSON 6902 ``patches`` with a ``target``. Where
kubectl exists, a test proves the renderer gives the same objects.

``operator_checkout`` copies deploy/k8s as an operator has it before an apply: the
production overlays build only from the secrets an operator writes.
"""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

K8S_DIR = REPO / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S_DIR / "overlays").iterdir() if p.is_dir())
_KNOWN_FIELDS = {
    "apiVersion", "kind", "namespace", "labels", "resources", "components",
    "configMapGenerator", "secretGenerator", "generatorOptions", "patches",
}  # fmt: skip
_CLUSTER_SCOPED = {"Namespace"}
_BASE64_LINE = 70
_GENERATED = "_fairq_test_generated"  # marks a generated ConfigMap until its name is final

Obj = dict[str, Any]


def kustomize(path: Path) -> list[Obj]:
    """The objects ``kubectl kustomize path`` would print."""
    objects = _build(path)
    _apply_name_hashes(objects)
    return objects


def kubectl_kustomize(path: Path) -> list[Obj]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def has_kubectl() -> bool:
    return shutil.which("kubectl") is not None


def _load_kustomization(path: Path) -> Obj:
    spec = yaml.safe_load((path / "kustomization.yaml").read_text()) or {}
    unknown = set(spec) - _KNOWN_FIELDS
    if unknown:
        raise NotImplementedError(f"{path}: the test renderer does not implement {unknown}")
    return spec


def _build(path: Path) -> list[Obj]:
    spec = _load_kustomization(path)
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        target = path / entry
        objects += _build(target) if target.is_dir() else _read(target)
    for component in spec.get("components", []):
        objects = _apply_component(path / component, objects)
    objects += [_generate_config_map(path, gen) for gen in spec.get("configMapGenerator", [])]
    objects += [_generate_secret(path, spec, gen) for gen in spec.get("secretGenerator", [])]
    _transform(path, spec, objects)
    return objects


def _generate_secret(path: Path, spec: Obj, generator: Obj) -> Obj:
    if set(generator) - {"name", "envs"} or not spec.get("generatorOptions", {}).get(
        "disableNameSuffixHash"
    ):
        raise NotImplementedError(f"{path}: secretGenerator {generator} (envs, unhashed only)")
    data = {}
    for entry in generator["envs"]:
        for line in (path / entry).read_text().splitlines():  # a missing file fails, as there
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = _kustomize_base64(value.strip())
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": generator["name"]},
        "type": "Opaque",
        "data": data,
    }


def _kustomize_base64(value: str) -> str:
    """Base64 as kustomize writes it: lines of 70 characters, in a YAML block (which
    ends with a newline) once there is more than one."""
    encoded = base64.b64encode(value.encode()).decode()
    if len(encoded) <= _BASE64_LINE:
        return encoded
    lines = [encoded[i : i + _BASE64_LINE] for i in range(0, len(encoded), _BASE64_LINE)]
    return "\n".join(lines) + "\n"


def _apply_component(path: Path, objects: list[Obj]) -> list[Obj]:
    spec = _load_kustomization(path)
    if spec.get("kind") != "Component":
        raise ValueError(f"{path} is listed as a component but is a {spec.get('kind')}")
    for entry in spec.get("resources", []):
        target = path / entry
        objects = objects + (_build(target) if target.is_dir() else _read(target))
    objects += [_generate_config_map(path, gen) for gen in spec.get("configMapGenerator", [])]
    _transform(path, spec, objects)
    return objects


def _read(path: Path) -> list[Obj]:
    # A YAML alias loads as the same dict as its anchor; Kustomize expands it into a copy,
    # so a label added to metadata.labels must not reach a selector that reused it.
    return [json.loads(json.dumps(doc)) for doc in yaml.safe_load_all(path.read_text()) if doc]


def _generate_config_map(path: Path, generator: Obj) -> Obj:
    if set(generator) - {"name", "files"}:
        raise NotImplementedError(f"configMapGenerator fields {set(generator)}")
    data = {}
    for entry in generator["files"]:
        key, _, file = entry.partition("=")
        data[key if file else Path(key).name] = (path / (file or key)).read_text()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": generator["name"], _GENERATED: True},
        "data": data,
    }


def _transform(path: Path, spec: Obj, objects: list[Obj]) -> None:
    for patch in spec.get("patches", []):
        _apply_json6902(path, patch, objects)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in _CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    for labels in spec.get("labels", []):
        if labels.get("includeSelectors") or labels.get("includeTemplates"):
            raise NotImplementedError("labels with includeSelectors/includeTemplates")
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(labels["pairs"])


def _apply_json6902(path: Path, patch: Obj, objects: list[Obj]) -> None:
    target, ops = patch["target"], yaml.safe_load(patch["patch"])
    if not isinstance(ops, list):
        raise NotImplementedError(f"{path}: only JSON 6902 patches are implemented")
    matched = [o for o in objects if _matches(o, target)]
    if not matched:
        raise ValueError(f"{path}: patch target {target} matches nothing")
    for obj in matched:
        for op in ops:
            _json_patch_op(obj, op)


def _matches(obj: Obj, target: Obj) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    wanted = {"kind": obj["kind"], "name": obj["metadata"]["name"], "group": group,
              "version": version}  # fmt: skip
    return all(wanted.get(field) == value for field, value in target.items())


def _json_patch_op(obj: Obj, op: Obj) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"][1:].split("/")]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if op["op"] == "remove":
        del node[int(last) if isinstance(node, list) else last]
    elif op["op"] in ("add", "replace"):
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            node.insert(index, op["value"]) if op["op"] == "add" else node.__setitem__(
                index, op["value"]
            )
        else:
            if op["op"] == "replace" and last not in node:
                raise KeyError(f"replace of a missing path {op['path']}")
            node[last] = op["value"]
    else:
        raise NotImplementedError(f"JSON patch op {op['op']}")


def _apply_name_hashes(objects: list[Obj]) -> None:
    renamed: dict[tuple[str | None, str], str] = {}
    for obj in objects:
        meta = obj["metadata"]
        if meta.pop(_GENERATED, False):
            new = f"{meta['name']}-{config_map_hash(obj)}"
            renamed[(meta.get("namespace"), meta["name"])] = new
            meta["name"] = new
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if pod is not None:
            _rename_references(pod, obj["metadata"].get("namespace"), renamed)


def _rename_references(pod: Obj, namespace: str | None, renamed: dict[Any, str]) -> None:
    refs = [v["configMap"] for v in pod.get("volumes", []) if "configMap" in v]
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        refs += [e["configMapRef"] for e in container.get("envFrom", []) if "configMapRef" in e]
        refs += [
            e["valueFrom"]["configMapKeyRef"]
            for e in container.get("env", [])
            if "configMapKeyRef" in e.get("valueFrom", {})
        ]
    for ref in refs:
        ref["name"] = renamed.get((namespace, ref["name"]), ref["name"])


def config_map_hash(config_map: Obj) -> str:
    """Kustomize's name suffix: a SHA-256 of kind and data, shortened and de-vowelled.

    Kustomize's hasher also encodes the name, but for a generated ConfigMap it reads it
    as empty (seen with kubectl 1.32's kustomize v5.5): the suffix follows the data alone.
    """
    encoded = json.dumps(
        {"kind": "ConfigMap", "name": "", "data": config_map["data"]},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    # Go's encoding/json escapes these; the hash is of Go's bytes.
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        encoded = encoded.replace(char, escape)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def by_identity(objects: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    return {
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
    }


# What an operator supplies before `kubectl apply -k overlays/production` (the secrets files
# of each production overlay), and the key `fairq k8s add-key` would have made.
OPERATOR_REDIS_PASSWORD = "3f1c0e9a7b5d4c2e8f6a1b3d5c7e9f0a"
OPERATOR_ENGINE_KEY = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b"
OPERATOR_KEY_ENTRY = {"sha256": "5" * 64, "user": "ops", "admin": True}
_OPERATOR_FILES = {
    "production": {
        "redis.env": f"password={OPERATOR_REDIS_PASSWORD}\n"
        f"url=redis://:{OPERATOR_REDIS_PASSWORD}@redis:6379/0\n",
        "engine.env": f"api_key={OPERATOR_ENGINE_KEY}\n",
    },
    "external-redis": {
        "redis.env": f"url=rediss://:{OPERATOR_REDIS_PASSWORD}@my-redis.example.internal:6380/0\n",
        "engine.env": f"api_key={OPERATOR_ENGINE_KEY}\n",
    },
}


def operator_checkout(target: Path) -> Path:
    """deploy/k8s copied to ``target``, with an API key of the operator's in fairq.yaml
    (rendered) and the secrets files of each production overlay; its deploy/k8s."""
    from fairq.k8s import keys as k8s_keys
    from fairq.k8s import render as k8s

    shutil.copytree(K8S_DIR, target, ignore=shutil.ignore_patterns("*.env"))
    for overlay, files in _OPERATOR_FILES.items():
        for name, text in files.items():
            (target / "overlays" / overlay / "secrets" / name).write_text(text)
    k8s_keys.add_key(target / "fairq.yaml", OPERATOR_KEY_ENTRY)
    k8s.write(target)
    return target


@functools.cache
def operator_k8s_dir() -> Path:
    """One ``operator_checkout`` for the session (removed at exit): what the manifest
    tests render each overlay from."""
    folder = Path(tempfile.mkdtemp(prefix="fairq-k8s-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return operator_checkout(folder / "k8s")
