"""A user's own configuration: the example loads; ``fairq config check``, every service
and ``fairq up`` name each problem of a bad file by its line and the setting's path (a
dependency between settings at the setting it names), and ``fairq config check`` notes
each setting written in its old place by its line; ``fairq up`` never ignores
FAIRQ_CONFIG. (The example itself is generated: tests/fairq/test_config_docs.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker import load_settings
from fairq.stack.localredis import free_port
from tests.support.cli import fairq

EXAMPLE = Path(__file__).resolve().parents[2] / "fairq.example.yaml"

BAD = """\
models:
  - name: chat
    endpoints: ["localhost:8000"]
    polcy: token_fair
result_ttl_s: soon
api_keys:
  - {sha256: "12", user: bob}
"""


def test_the_example_configuration_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRQ_CONFIG", str(EXAMPLE))
    settings = load_settings()
    assert [m.name for m in settings.models] == ["my-model"]
    assert [k.user for k in settings.api_keys] == ["alice", "assistant-app", "admin"]


def test_config_check_names_the_line_and_path_of_each_problem(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(BAD)
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{path}:3: models[0].endpoints: endpoint 'localhost:8000' must be an http:// or "
        "https:// base URL",
        f"{path}:4: models[0].polcy: not a setting of fairq (a typo? every setting is in "
        "fairq.example.yaml)",
        f"{path}:5: result_ttl_s: Input should be a valid integer, unable to parse string "
        "as an integer (got 'soon')",
        f"{path}:7: api_keys[0].sha256: sha256 must be 64 lowercase hex digits (see "
        "`fairq hash-key`)",
    ]


def line_of(text: str, start: str) -> int:
    """The 1-based number of the first line of ``text`` that starts with ``start``."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if line.startswith(start))


LEASES = """\
lease_ms: 1000
worker_concurrency: 8
lease_renew_ms: 900
"""

UNKNOWN_ENGINE = """\
engines:
  - name: gpu-a
    endpoints: ["http://10.0.0.1:8000"]
models:
  - name: chat
    engine: gpu-a
  - name: code
    engine: gpu-b
"""


def test_config_check_names_the_line_of_a_violated_dependency(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(LEASES)
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{path}:{line_of(LEASES, 'lease_renew_ms')}: lease_renew_ms: 900 is more than half "
        "of lease_ms (1000), so a live worker could lose its jobs between renewals: renew at "
        "most every 500 ms"
    ]


def test_config_check_names_the_line_of_a_models_unknown_engine(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(UNKNOWN_ENGINE)
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{path}:{line_of(UNKNOWN_ENGINE, '    engine: gpu-b')}: models[1].engine: 'gpu-b' is "
        "neither the name of an entry of engines (gpu-a) nor a kind of engine (vllm, sglang, "
        "tgi, llamacpp, openai): name the entry of engines that serves the model"
    ]


OLD_FORM = """\
models:
  - name: chat
    engine: vllm
    endpoints: ["http://10.0.0.1:8000"]
    policy: token_fair
    batch_slots: 8
"""


def test_config_check_notes_each_setting_in_its_old_place_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(OLD_FORM)
    done = fairq("config", "check", str(path))
    assert done.returncode == 0, done.stderr
    moved = [line for line in done.stdout.splitlines() if ": note: models[" in line]
    assert moved == [
        f"{path}:{line_of(OLD_FORM, f'    {key}')}: note: models[0].{key}: an engine setting: "
        f"move it to an entry of engines ({shown}) and give the model engine: <that entry's "
        "name>"
        for key, shown in (
            ("engine", "kind: vllm"),
            ("endpoints", 'endpoints: ["http://10.0.0.1:8000"]'),
            ("batch_slots", "batch_slots: 8"),
        )
    ]


def test_config_check_names_the_line_of_a_yaml_error(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text("models:\n  - name: a\n   endpoints: [x]\n")
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"{path}:3: not valid YAML")


def test_config_check_blames_the_environment_for_its_own_problem() -> None:
    done = fairq("config", "check", str(EXAMPLE), env={"FAIRQ_RESULT_TTL_S": "soon"})
    assert done.returncode == 2
    assert "result_ttl_s:" in done.stderr
    assert "(set by the environment: FAIRQ_RESULT_TTL_S)" in done.stderr
    assert not re.search(rf"{EXAMPLE}:\d", done.stderr)  # no line of the file is blamed


def test_config_check_summarises_a_valid_file_and_what_it_lacks(tmp_path: Path) -> None:
    done = fairq("config", "check", str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    assert "valid: 1 model(s): my-model (vllm, 1 endpoint); 3 API key(s)" in done.stdout
    assert "no redis_url" in done.stdout
    bare = tmp_path / "bare.yaml"
    bare.write_text("models: []\n")
    done = fairq("config", "check", str(bare), env={"FAIRQ_REDIS_URL": "redis://r:6379/0"})
    assert done.returncode == 0
    assert "no models" in done.stdout and "no api_keys" in done.stdout
    assert "no redis_url" not in done.stdout


def test_a_service_on_a_bad_file_names_each_problems_line(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(BAD)
    env = {"FAIRQ_CONFIG": str(path), "FAIRQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = fairq("dispatcher", env=env)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 4 and "Traceback" not in done.stderr
    assert lines[0].startswith(f"fairq: configuration error: {path}:3: models[0].endpoints")


def test_fairq_up_refuses_a_bad_file_naming_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(BAD)
    for args, env in ((["--config", str(path)], {}), ([], {"FAIRQ_CONFIG": str(path)})):
        done = fairq("up", "--port", str(free_port()), *args, env=env)
        assert done.returncode == 2
        assert f"fairq up: {path}:4: models[0].polcy" in done.stderr


def test_fairq_up_says_when_fairq_config_names_no_file(tmp_path: Path) -> None:
    gone = tmp_path / "gone.yaml"
    done = fairq("up", env={"FAIRQ_CONFIG": str(gone)})
    assert done.returncode == 2
    assert f"FAIRQ_CONFIG names {gone}, which is not a file" in done.stderr
    assert "unset FAIRQ_CONFIG to run the demo" in done.stderr


def test_fairq_up_engine_url_without_an_engine_says_what_to_check() -> None:
    engine = f"http://127.0.0.1:{free_port()}"
    done = fairq("up", "--engine-url", engine)
    assert done.returncode == 2
    assert f"cannot ask {engine}/v1/models which model it serves" in done.stderr
    assert "is the engine running? (--model NAME starts without asking)" in done.stderr


def test_fairq_up_takes_config_or_engine_url_not_both() -> None:
    done = fairq("up", "--config", str(EXAMPLE), "--engine-url", "http://127.0.0.1:1")
    assert done.returncode == 2
    assert "--config and --engine-url: one or the other" in done.stderr


DISCOVERY = """\
models:
  - name: llama
    discovery:
      dns: engine-llama.fairq.svc.cluster.local
      port: 8000
      interval_s: 2
      nameservers: ["10.96.0.10:53"]
  - name: both
    endpoints: ["http://10.0.0.5:8000"]
    discovery: {dns: engine-both.fairq.svc.cluster.local, port: 8000, scheme: https}
"""


def test_config_check_accepts_replicas_found_through_dns(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(DISCOVERY)
    done = fairq("config", "check", str(path))
    assert done.returncode == 0, done.stderr
    assert (
        "llama (vllm, replicas of DNS engine-llama.fairq.svc.cluster.local port 8000), "
        "both (vllm, 1 endpoint + replicas of DNS engine-both.fairq.svc.cluster.local "
        "port 8000)"
    ) in done.stdout


BAD_DISCOVERY = """\
models:
  - name: nowhere
  - name: llama
    discovery:
      dns: "engine llama"
      port: 80000
      scheme: grpc
      nameservers: ["kube-dns:53"]
"""


def test_config_check_names_each_problem_of_a_discovery(tmp_path: Path) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_text(BAD_DISCOVERY)
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == (
        f"{path}:2: models[0]: model 'nowhere' needs endpoints (a list of base URLs), "
        "discovery (a DNS name whose records are its replicas), or both"
    )
    assert lines[1].startswith(f"{path}:5: models[1].discovery.dns: dns 'engine llama' must")
    assert lines[2].startswith(f"{path}:6: models[1].discovery.port: Input should be less")
    assert lines[3].startswith(f"{path}:7: models[1].discovery.scheme: Input should be 'http'")
    assert lines[4].startswith(
        f"{path}:8: models[1].discovery.nameservers: nameserver 'kube-dns:53' must be an IP"
    )
    assert len(lines) == 5


def test_fairq_up_names_where_a_models_replicas_are_found(tmp_path: Path) -> None:
    from fairq.stack.upconfig import file_plan

    path = tmp_path / "fairq.yaml"
    path.write_text(DISCOVERY)
    assert file_plan(path).models == (
        "llama  vllm (metrics admission) at the replicas of DNS "
        "engine-llama.fairq.svc.cluster.local port 8000",
        "both  vllm (metrics admission) at http://10.0.0.5:8000, the replicas of DNS "
        "engine-both.fairq.svc.cluster.local port 8000",
    )


ONE_KEY_TWICE = """\
api_keys:
  - sha256: ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
    user: alice
  - user: bob
    sha256: ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
"""


def test_config_check_refuses_one_key_listed_twice_at_the_second(tmp_path: Path) -> None:
    # The gateway keeps one entry per key: the other's user, bands and models would be
    # dropped without a word.
    path = tmp_path / "fairq.yaml"
    path.write_text(ONE_KEY_TWICE)
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{path}:{line_of(ONE_KEY_TWICE, '    sha256')}: api_keys[1].sha256: the same key as "
        "api_keys[0] (user 'alice'): list each key once; each user its own key "
        "(`fairq hash-key KEY`)"
    ]


UNKNOWN_TARGET_BAND = """\
engines:
  - name: gpu-a
    endpoints: ["http://10.0.0.1:8000"]
    queue_targets:
      interactive: 2
      interactiv: 4
models:
  - name: chat
    engine: gpu-a
  - name: old
    endpoints: ["http://10.0.0.2:8000"]
    queue_targets: {bulk: 1}
"""


@pytest.mark.parametrize("fixed", ["", "interactiv"])
def test_config_check_refuses_a_queue_target_of_an_unknown_band(tmp_path: Path, fixed: str) -> None:
    text = UNKNOWN_TARGET_BAND.replace(f"      {fixed}: 4\n", "") if fixed else UNKNOWN_TARGET_BAND
    path = tmp_path / "fairq.yaml"
    path.write_text(text)
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    where, band = (
        ("models[1].queue_targets.bulk", "bulk") if fixed else
        ("engines[0].queue_targets.interactiv", "interactiv")
    )  # fmt: skip
    line = line_of(text, "    queue_targets: {bulk" if fixed else "      interactiv:")
    assert done.stderr.splitlines() == [
        f"{path}:{line}: {where}: {band!r} is not a band, so this target would never apply: "
        "the bands are interactive, default, batch"
    ]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("# a list, not settings\n- a\n- b\n", 2, "must be a mapping of settings"),
        ('models: []\nuser: "\xff"\n', 2, "not UTF-8 text (byte 0xff)"),
        (
            "models: []\nlease_ms: 1000\n",
            2,
            "lease_ms: 1000 is less than twice lease_renew_ms (3000, its default)",
        ),
    ],
)
def test_config_check_names_the_line_of_every_problem_of_the_file(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = tmp_path / "fairq.yaml"
    path.write_bytes(text.encode("latin-1"))
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"{path}:{line}: {message}"), done.stderr
