"""Every field of a batch's hash that the product names is one of broker.batch.batch_fields'
names: the scripts' literals, and in Python the constants themselves (a literal field at a
hash call on a batch key, a batch record's accessor or a status move is refused), so the
two cannot drift apart."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from broker import lua
from broker.batch import batch_fields

ROOT = Path(__file__).resolve().parents[2]
LUA = Path(lua.__file__).parent
NAMES = {v for k, v in vars(batch_fields).items() if k.isupper() and isinstance(v, str)}
# The code that reads or writes a batch's hash
PYTHON = [ROOT / "broker" / "batch", ROOT / "batch", ROOT / "gateway"]
HASH_CALLS = {"hget", "hset", "hmget", "hincrby", "hdel", "hsetnx", "hexists"}
_LUA_CALL = re.compile(r"redis\.call\('H[A-Z]+', KEYS\[1\], '(\w+)'")


def batch_scripts() -> Iterator[Path]:
    """The scripts whose KEYS[1] is a batch's hash itself (not its results or lease)."""
    for path in sorted(LUA.glob("*.lua")):
        if re.search(r"KEYS\[1\] batch hash\s+fq:batch:\{id\}\s*(\(|$)", path.read_text(), re.M):
            yield path


def lua_fields() -> set[str]:
    return {field for path in batch_scripts() for field in _LUA_CALL.findall(path.read_text())}


def _is_batch_key(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "batch"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "keys"
    )


def _literals(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        yield str(node.value)
    elif isinstance(node, ast.List | ast.Tuple):
        for item in node.elts:
            yield from _literals(item)
    elif isinstance(node, ast.Dict):
        for key in node.keys:
            if key is not None:
                yield from _literals(key)


def literal_fields(tree: ast.AST) -> Iterator[tuple[str, str]]:
    """(where, literal) of each field a call names by a literal: a hash call on a batch
    key, a batch record's ``s``/``n``, a status move's stamp; and each keyword of a move
    that is not a field's name."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, args = node.func.attr, node.args
        if name in HASH_CALLS and args and _is_batch_key(args[0]):
            for arg in [*args[1:], *(k.value for k in node.keywords if k.arg == "mapping")]:
                yield from ((name, literal) for literal in _literals(arg))
        elif name in ("s", "n") and len(args) == 1:
            yield from ((name, literal) for literal in _literals(args[0]))
        elif name == "move" and len(args) >= 4:
            yield from (("move stamp", literal) for literal in _literals(args[3]))
            named = (k.arg for k in node.keywords if k.arg is not None)
            yield from (("move field", k) for k in named if k not in NAMES)


def test_every_field_a_batch_script_touches_is_named() -> None:
    assert [p.name for p in batch_scripts()] == ["batch_record.lua", "batch_status.lua"]
    assert lua_fields() == {"status"} <= NAMES


def test_python_names_every_batch_field_by_its_constant() -> None:
    found = {}
    for folder in PYTHON:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for where, literal in literal_fields(tree):
                found.setdefault(f"{path.relative_to(ROOT)}: {where}", []).append(literal)
    assert found == {}


def test_the_scanner_finds_literal_fields() -> None:
    planted = """
redis.hset(keys.batch(b), "total", 3)
pipe.hmget(keys.batch(b), ["status", batch_fields.LINE])
pipe.hset(keys.batch(b), mapping={"off": 1, batch_fields.LINE: 2})
redis.hset(keys.files(b), "total", 3)
batch.n("queued")
store.move(b, "failed", ("validating",), "failed_at", errors=e, surprise=1)
"""
    assert sorted(literal_fields(ast.parse(planted))) == [
        ("hmget", "status"),
        ("hset", "off"),
        ("hset", "total"),
        ("move field", "surprise"),
        ("move stamp", "failed_at"),
        ("n", "queued"),
    ]


def test_the_times_are_the_statuses_stamped() -> None:
    assert len(batch_fields.TIMES) == len(set(batch_fields.TIMES)) == 7
    assert all(t.endswith("_at") and t in NAMES for t in batch_fields.TIMES)
