"""The security rules, each tried for real.

* API keys exist in the configuration only as SHA-256 hashes; settings print the
  Redis password masked.
* A key cannot raise its own priority: a band it is not entitled to is refused
  (403), an engine ``priority`` in the body is dropped. A band that does not exist is a
  bad request (400), and the message does not repeat a long header back.
* A trailing slash is an unknown URL (404), not a redirect whose Location comes from the
  Host header the client sent.
* Every route that takes a job, file or batch id answers 404 to another user's
  key (and the test fails when a new id route is not tried).
* Every admin route is for admin keys only: any other caller (another key, a wrong
  key, none, a wrong method) gets the 404 of an unknown URL, and the public OpenAPI
  document lists none of them (nor the operator's /metrics and /dashboard).
* Redis AUTH (``redis://:password@``) and TLS (``rediss://``) work through the
  URL alone, for every process of a real stack.
* At the default log level, no process logs an API key, a prompt or the Redis
  password, even when requests fail.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from pkgutil import iter_modules

import httpx
import orjson
import pytest
import redis
from fastapi.routing import APIRoute
from pydantic import ValidationError

from broker import ApiKeyConfig, JobQueue, KeyRing, Settings, StreamMode, Submission
from broker.jobs import RequestKind
from broker.requests import engine_payload
from fairq.stack.localredis import LocalRedis
from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support.settings import (
    ADMIN,
    ADMIN_KEY,
    ALICE,
    ALICE_KEY,
    BOB,
    BOB_KEY,
    api_key,
    make_config,
    make_settings,
)
from tests.support.stack import demo_stack
from tests.support.stack import gateway as gateway_server
from tests.support.tlsproxy import make_certificates, tls_proxy

MODEL = "sec-model"
CONFIG = make_config(
    ["http://engine-0:8000"],
    model=MODEL,
    api_keys=[
        api_key(ADMIN_KEY, "ops", admin=True),
        api_key(ALICE_KEY, "alice"),
        api_key(BOB_KEY, "bob", bands=["default", "batch"]),  # default and batch only
    ],
)


def test_api_keys_are_configured_only_as_hashes() -> None:
    with pytest.raises(ValidationError, match="64 lowercase hex"):
        ApiKeyConfig(sha256="k-alice", user="alice")
    settings = make_settings(**CONFIG)
    assert "k-alice" not in settings.model_dump_json()
    ring = KeyRing(settings)
    assert ring.resolve("k-alice").user == "alice"
    assert ring.resolve("k-admin").admin and not ring.resolve("k-alice").admin


def test_settings_print_the_redis_password_masked() -> None:
    settings = Settings(redis_url="redis://:s3cret-pw@redis:6379/0")  # type: ignore[arg-type]
    assert "s3cret-pw" not in repr(settings) and "s3cret-pw" not in str(settings)
    assert settings.require_redis_url() == "redis://:s3cret-pw@redis:6379/0"


def test_an_engine_priority_in_the_body_never_reaches_the_engine() -> None:
    settings = make_settings(**CONFIG)
    model = settings.models[0]
    payload = orjson.loads(engine_payload({"model": MODEL, "prompt": "x", "priority": -100},
                                          "job-1", model))  # fmt: skip
    assert "priority" not in payload


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    with gateway_server(make_settings(redis_url, **CONFIG)) as url:
        yield url


@pytest.fixture
async def http(gateway: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway, timeout=10) as client:
        yield client


def _chat(content: str = "hi") -> dict[str, object]:
    return {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": content}]}


async def _queue(redis_url: str, user: str, band: str, n: int) -> None:
    """Jobs queued directly through the broker (nobody dispatches in these tests)."""
    from redis.asyncio import Redis

    client = Redis.from_url(redis_url)
    queue = JobQueue(client, make_settings(redis_url, **CONFIG))
    sub = Submission(model=MODEL, owner=user, user=user, tenant=user, band=band,
                     kind=RequestKind.CHAT, stream_flag=StreamMode.STREAMED,
                     payload=b"{}")  # fmt: skip
    for _ in range(n):
        await queue.submit(sub)
    await client.aclose()


@pytest.mark.integration
async def test_a_key_cannot_raise_its_own_band(http: httpx.AsyncClient) -> None:
    refused = await http.post("/v1/chat/completions", json=_chat(), headers={
        **BOB, "X-Fairq-Band": "interactive"})  # fmt: skip
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    assert "default, batch" in refused.json()["error"]["message"]
    # Without the header the key's own default band is used, never a higher one.
    early = {**BOB, "X-Fairq-Stream-Headers": "early"}  # the 200 while the job is queued
    async with http.stream("POST", "/v1/chat/completions", json=_chat(), headers=early) as sent:
        assert sent.status_code == 200
        queue = (await http.get(f"/v1/admin/models/{MODEL}/queue", headers=ADMIN)).json()
    queued = {b["band"]: b["queued"] for b in queue["bands"]}
    assert queued["interactive"] == 0


@pytest.mark.integration
async def test_an_unknown_band_gets_400_and_is_not_echoed_whole(http: httpx.AsyncClient) -> None:
    for band in ("nosuch", "A" * 4000):
        refused = await http.post(
            "/v1/chat/completions", json=_chat(), headers={**ALICE, "X-Fairq-Band": band}
        )
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "unknown_band" and "interactive, default, batch" in error["message"]
        assert len(error["message"]) < 200


@pytest.mark.integration
async def test_a_trailing_slash_gets_404_not_a_redirect_to_the_host_header(
    http: httpx.AsyncClient,
) -> None:
    for method, path in [("POST", "/v1/chat/completions/"), ("POST", "/v1/completions/"),
                         ("GET", "/v1/files/"), ("GET", "/v1/batches/")]:  # fmt: skip
        response = await http.request(method, path, headers={"Host": "evil.example"})
        assert response.status_code == 404, (path, response.status_code)
        assert "location" not in response.headers
        assert response.json()["error"]["code"] == "unknown_url"


@pytest.mark.integration
async def test_admins_see_each_bands_backlog_and_top_users(
    http: httpx.AsyncClient, redis_url: str
) -> None:
    await _queue(redis_url, "alice", "interactive", 3)
    await _queue(redis_url, "bob", "interactive", 1)
    await _queue(redis_url, "carol", "batch", 2)
    response = await http.get(f"/v1/admin/models/{MODEL}/queue", headers=ADMIN)
    assert response.status_code == 200
    bands = {b["band"]: b for b in response.json()["bands"]}
    assert bands["interactive"]["queued"] == 4 and bands["interactive"]["users"] == 2
    assert bands["interactive"]["top_users"] == [
        {"user": "alice", "queued": 3}, {"user": "bob", "queued": 1}]  # fmt: skip
    assert sorted(bands["interactive"]["next_users"]) == ["alice", "bob"]
    assert bands["batch"]["top_users"] == [{"user": "carol", "queued": 2}]
    assert bands["default"] == {"band": "default", "queued": 0, "users": 0,
                                "next_users": [], "top_users": []}  # fmt: skip
    everything = (await http.get("/v1/admin/queues", headers=ADMIN)).json()
    assert [m["model"] for m in everything["data"]] == [MODEL]
    unknown = await http.get("/v1/admin/models/nope/queue", headers=ADMIN)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


# Every admin route of the gateway, with a path to try it on (a new one must be added).
ADMIN_ROUTES = {
    ("GET", "/admin/status"): "/admin/status",
    ("GET", "/v1/admin/queues"): "/v1/admin/queues",
    ("GET", "/v1/admin/models/{model:path}/queue"): f"/v1/admin/models/{MODEL}/queue",
    ("GET", "/v1/admin/dead-letters"): f"/v1/admin/dead-letters?model={MODEL}",
}
NOT_ADMIN = [ALICE, {"Authorization": "Bearer k-wrong"}, {}]


@pytest.mark.integration
async def test_every_admin_route_answers_anyone_else_as_an_unknown_url(
    http: httpx.AsyncClient,
) -> None:
    unknown = await http.get("/v1/admin/nosuch", headers=ALICE)
    assert unknown.status_code == 404
    for (method, _), path in ADMIN_ROUTES.items():
        where = f"{method} {path.partition('?')[0]}"
        same = {**unknown.json()["error"], "message": f"Invalid URL ({where})"}
        for headers in NOT_ADMIN:
            answer = await http.request(method, path, headers=headers)
            assert answer.status_code == 404, (where, headers, answer.text)
            assert answer.json()["error"] == same and "www-authenticate" not in answer.headers
        wrong_method = await http.request("PUT", path, headers=ALICE)  # not a 405 either
        assert wrong_method.status_code == 404, (path, wrong_method.text)
        assert (await http.request(method, path, headers=ADMIN)).status_code == 200, path
    admin = {(m, r.path) for r in _routes() if "admin" in r.path for m in r.methods or ()}
    assert admin == set(ADMIN_ROUTES)


def _routes() -> list[APIRoute]:
    """The routes of every router in the gateway's modules."""
    package = importlib.import_module("gateway")  # not the fixture of that name
    modules = (importlib.import_module(f"gateway.{m.name}") for m in iter_modules(package.__path__))
    routers = [module.router for module in modules if hasattr(module, "router")]
    return [route for router in routers for route in router.routes if isinstance(route, APIRoute)]


@pytest.mark.integration
async def test_the_public_openapi_document_lists_no_admin_or_operator_route(
    http: httpx.AsyncClient,
) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert "/v1/chat/completions" in paths
    hidden = [p for p in paths if "admin" in p or p in ("/metrics", "/dashboard")]
    assert hidden == []


def _run_one_job(stack: Stack, key: str, prompt: str) -> None:
    body = {"model": DEMO_MODELS[0], "max_tokens": 4,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=stack.gateway_url, timeout=20) as client:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4


@pytest.mark.integration
def test_every_process_authenticates_to_redis_through_the_url(
    capfd: pytest.CaptureFixture[str],
) -> None:
    password = "pw-7f3c0d9e2b"
    prompt = "PROMPT-TEXT-8c1e4f secret plans"
    with LocalRedis(password=password) as server:
        with redis.Redis(port=server.port) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()  # AUTH is really on
        assert server.url.startswith(f"redis://:{password}@")
        with demo_stack(redis_url=server.url) as stack:
            _run_one_job(stack, "fq-demo-alice", prompt)
            _failing_requests(stack, prompt)
    # Nothing secret in any process's log at the default level, failures included.
    logs = capfd.readouterr()
    output = logs.out + logs.err
    assert "serving models: demo-chat" in output  # the processes' logs were captured
    for secret in (password, "fq-demo-alice", "fq-demo-bob", "PROMPT-TEXT-8c1e4f"):
        assert secret not in output


def _failing_requests(stack: Stack, prompt: str) -> None:
    """Requests that fail in each layer, each carrying the key and the prompt."""
    with httpx.Client(base_url=stack.gateway_url, timeout=20) as client:
        messages = [{"role": "user", "content": prompt}]
        bad = [
            {"model": DEMO_MODELS[0], "max_tokens": -1, "messages": messages},
            {"model": "no-such-model", "messages": messages},
            # the engine refuses it (too long): the worker and the gateway report it
            {"model": DEMO_MODELS[0], "max_tokens": 999999, "messages": messages},
        ]
        for body in bad:
            response = client.post("/v1/chat/completions", json=body,
                                   headers={"Authorization": "Bearer fq-demo-bob"})  # fmt: skip
            assert response.status_code >= 400
        wrong_key = client.post("/v1/chat/completions", json=bad[0],
                                headers={"Authorization": f"Bearer {prompt}"})  # fmt: skip
        assert wrong_key.status_code == 401


@pytest.mark.integration
def test_every_process_talks_tls_to_redis_through_a_rediss_url(tmp_path: Path) -> None:
    ca, cert, key = make_certificates(tmp_path)
    with LocalRedis(password="pw-tls") as server, tls_proxy(server.port, cert, key) as port:
        url = f"rediss://:pw-tls@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        with redis.Redis.from_url(url) as client:
            assert client.ping()
        # The port speaks only TLS, and the certificate is checked (no CA given: refused).
        for wrong in (
            f"redis://:pw-tls@127.0.0.1:{port}/0",
            f"rediss://:pw-tls@127.0.0.1:{port}/0",
        ):
            client = redis.Redis.from_url(wrong, socket_timeout=2)
            with client, pytest.raises(redis.ConnectionError):
                client.ping()
        with demo_stack(redis_url=url) as stack:
            _run_one_job(stack, "fq-demo-alice", "hello over TLS")


@pytest.mark.integration
async def test_every_route_that_takes_an_id_answers_404_to_another_users_key(
    gateway: str, http: httpx.AsyncClient, redis_url: str
) -> None:
    line = orjson.dumps({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions",
                         "body": _chat() | {"stream": False}})  # fmt: skip
    upload = await http.post("/v1/files", headers=ALICE, data={"purpose": "batch"},
                             files={"file": ("in.jsonl", line + b"\n")})  # fmt: skip
    file_id = upload.json()["id"]
    spec = {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}  # fmt: skip
    batch_id = (await http.post("/v1/batches", headers=ALICE, json=spec)).json()["id"]
    early = {**ALICE, "X-Fairq-Stream-Headers": "early"}  # the job id while it is queued
    async with http.stream("POST", "/v1/chat/completions", json=_chat(), headers=early) as sent:
        job_id = sent.headers["x-fairq-job-id"]
        tried = {
            ("GET", "/v1/jobs/{job_id}"): f"/v1/jobs/{job_id}",
            ("DELETE", "/v1/jobs/{job_id}"): f"/v1/jobs/{job_id}",
            ("GET", "/v1/jobs/{job_id}/stream"): f"/v1/jobs/{job_id}/stream",
            ("GET", "/v1/files/{file_id}"): f"/v1/files/{file_id}",
            ("GET", "/v1/files/{file_id}/content"): f"/v1/files/{file_id}/content",
            ("DELETE", "/v1/files/{file_id}"): f"/v1/files/{file_id}",
            ("GET", "/v1/batches/{batch_id}"): f"/v1/batches/{batch_id}",
            ("POST", "/v1/batches/{batch_id}/cancel"): f"/v1/batches/{batch_id}/cancel",
        }
        for (method, _), path in tried.items():
            response = await http.request(method, path, headers=BOB)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["error"]["type"] == "invalid_request_error"
        # Nor can another user start a batch from the file.
        assert (await http.post("/v1/batches", headers=BOB, json=spec)).status_code == 404
        # Still there for their owner: bob's attempts changed nothing.
        for (method, _), path in tried.items():
            if method == "GET" and not path.endswith("/stream"):  # that one follows the job
                assert (await http.get(path, headers=ALICE)).status_code == 200, path
    # Every route of the gateway with an id in its path is tried above (a new one must be too).
    schema = (await http.get("/openapi.json")).json()
    id_routes = {(method.upper(), path) for path, ops in schema["paths"].items()
                 for method in ops if "_id}" in path}  # fmt: skip
    assert id_routes == set(tried)
