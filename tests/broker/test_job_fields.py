"""Every field a Lua script reads or writes on a job hash, and every field of a ready entry,
is one of broker.job_fields' names: the scripts write them as literals, Python reads them
by name, and the two must not drift apart."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from broker import job_fields, lua

LUA = Path(lua.__file__).parent
NAMES = {v.decode() for k, v in vars(job_fields).items() if k.isupper()}
_CALL = re.compile(r"redis\.call\('(H[A-Z]+)', ")
# Where each command names fields, counted in its arguments after the key.
_FIELDS = {"HGET": slice(0, 1), "HSETNX": slice(0, 1), "HINCRBY": slice(0, 1)}
_FIELDS |= {"HEXISTS": slice(0, 1), "HMGET": slice(0, None), "HDEL": slice(0, None)}
_FIELDS |= {"HSET": slice(0, None, 2)}


def arguments(text: str, start: int) -> list[str]:
    """The arguments of the call whose list starts at ``start``, as Lua source."""
    args, depth, current, quoted = [], 0, "", False
    for char in text[start:]:
        if char == "'":
            quoted = not quoted
        elif not quoted and char in "({":
            depth += 1
        elif not quoted and char in ")}":
            if depth == 0:
                break
            depth -= 1
        elif not quoted and char == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        current += char
    return [*args, current.strip()]


def job_hashes(text: str) -> set[str]:
    """How a script names a job hash: ``job`` (and the prelude's ``j.key``), and each KEYS[n]
    or ARGV[n] its header gives as a job key or the job key prefix (``fq:{m}:job:``)."""
    named = re.findall(r"((?:KEYS|ARGV)\[\d+\])[^\[\n]*fq:\{m\}:job:", text)
    return {"job", "j.key", *named}


def job_hash_fields(text: str) -> Iterator[tuple[str, str]]:
    """(command, field literal) of every call on a job hash."""
    hashes = job_hashes(text)
    for call in _CALL.finditer(text):
        command, (target, *rest) = call.group(1), arguments(text, call.end())
        if target in hashes or target.split(" .. ")[0] in hashes:
            assert command in _FIELDS, f"{command} on a job hash: add it to _FIELDS"
            for field in rest[_FIELDS[command]]:
                assert field.startswith("'"), f"{command} {target}: field {field} not a literal"
                yield command, field.strip("'")


def test_every_job_hash_field_a_script_touches_is_named() -> None:
    seen: dict[str, set[str]] = {}
    for path in sorted(LUA.glob("*.lua")):
        for command, field in job_hash_fields(path.read_text()):
            seen.setdefault(field, set()).add(f"{path.name} {command}")
    unnamed = {field: where for field, where in seen.items() if field not in NAMES}
    assert unnamed == {}
    assert len(seen) >= 30  # the parser found the scripts' calls (not a vacuous pass)


def test_every_field_of_a_ready_entry_is_named() -> None:
    prelude = (LUA / "prelude.lua").read_text()
    table = prelude[prelude.index("local fields = {") :]
    entry = arguments(table, len("local fields = {"))[::2]
    appended = re.findall(r"fields\[#fields \+ 1\] = '(\w+)'", prelude)
    assert len(entry) == 9 and appended == ["rq"]
    assert {field.strip("'") for field in entry} | set(appended) <= NAMES


def test_the_parser_reads_a_call_on_a_job_hash() -> None:
    header = "-- KEYS[1] job hash   fq:{m}:job:{id}\n"
    text = header + "redis.call('HSET', KEYS[1], 'st', f(a, 'x'), 'zz', 1)"
    assert list(job_hash_fields(text)) == [("HSET", "st"), ("HSET", "zz")]
