"""No internal detail in a client's message: a Redis that stopped and an engine that
refuses the connection reach the client as what failed and an id, never as an address;
the log holds the detail under that id (the gateway's error id, the worker's job id).

A real Redis server stopped under a running gateway; the dispatcher and a worker in
this event loop against an engine URL where nothing listens, the gateway under uvicorn.
"""

from __future__ import annotations

import logging
import re

import httpx
import orjson
import pytest

from broker.failure_text import HIDDEN
from broker.jobs import new_job_id
from fairq.stack.localredis import LocalRedis, free_port
from gateway.errors import ERROR_ID_HEADER, JOB_HEADER
from tests.support.eventually import WAIT_S
from tests.support.settings import ALICE, MODEL, SIM_FAULTS, make_settings
from tests.support.stack import chat, components, gateway, sim

pytestmark = pytest.mark.integration

EARLY = {"X-Fairq-Stream-Headers": "early"}  # the 200 at once: a failure is an error event


def assert_no_address(text: str, port: int) -> None:
    for internal in ("redis://", "http://", "127.0.0.1", f":{port}", "Traceback", "Error("):
        assert internal not in text, text


async def test_a_stopped_redis_is_a_503_without_its_address_and_with_an_id_the_log_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    with LocalRedis(appendonly=False) as server, gateway(make_settings(server.url)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S, headers=ALICE) as http:
            assert (await http.get("/v1/files")).status_code == 200  # its pool is warm
            server.halt()
            answers = [
                await http.post("/v1/chat/completions", json=chat()),
                await http.post("/v1/chat/completions", json=chat(stream=True)),
                await http.get(f"/v1/jobs/{new_job_id(MODEL)}"),
                await http.get("/v1/files"),
            ]
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "redis_unavailable"
        assert_no_address(answer.text, server.port)
        error_id = answer.headers[ERROR_ID_HEADER]
        assert f"error id {error_id}" in answer.json()["error"]["message"]
        logged = [r for r in caplog.records if error_id in r.getMessage()]
        assert logged and logged[0].levelno >= logging.WARNING
        detail = logged[0].getMessage()  # the operator has redis-py's (or fairq's) own text
        assert "refused" in detail or "closed" in detail


async def test_an_engine_that_refuses_the_connection_fails_the_job_with_no_url_to_its_client(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="workers")
    port = free_port()  # nothing listens there
    settings = make_settings(
        redis_url,
        [f"http://127.0.0.1:{port}"],
        quick=True,
        engine_max_tries=2,
        engine_max_reroutes=0,
    )
    async with components(settings):
        with gateway(settings) as url:
            async with httpx.AsyncClient(base_url=url, timeout=WAIT_S, headers=ALICE) as http:
                async with http.stream(
                    "POST", "/v1/chat/completions", json=chat(stream=True), headers=EARLY
                ) as streamed:
                    job_id = streamed.headers[JOB_HEADER]
                    frames = [line async for line in streamed.aiter_lines() if line]
                job = (await http.get(f"/v1/jobs/{job_id}")).json()
                plain = await http.post("/v1/chat/completions", json=chat())
    events = [orjson.loads(f.removeprefix("data: ")) for f in frames if f.startswith("data: {")]
    error = events[-1]["error"]
    assert error["code"] == "engine_unreachable"
    assert job["status"] == "failed" and job["error"]["code"] == "engine_unreachable"
    assert plain.status_code == 502 and plain.json()["error"]["code"] == "engine_unreachable"
    for told in (error["message"], job["error"]["message"], plain.text):
        assert_no_address(told, port)
    assert "could not be reached" in error["message"] and job_id in error["message"]
    logged = [r.getMessage() for r in caplog.records if job_id in r.getMessage()]
    assert any(f"127.0.0.1:{port}" in line for line in logged), logged


async def test_an_engine_refusal_keeps_its_status_and_reason_without_the_address_it_names(
    redis_url: str,
) -> None:
    fault = {"kind": "status", "status": 400, "message": "proxy http://10.0.0.7:8000 said no"}
    with sim() as engine:
        settings = make_settings(redis_url, [engine], quick=True, model_fields=SIM_FAULTS)
        async with components(settings):
            with gateway(settings) as url:
                async with httpx.AsyncClient(base_url=url, timeout=WAIT_S, headers=ALICE) as http:
                    refused = await http.post("/v1/chat/completions", json=chat(sim_fault=fault))
                    job = (await http.get(f"/v1/jobs/{refused.headers[JOB_HEADER]}")).json()
    assert refused.status_code == 400, refused.text
    for error in (refused.json()["error"], job["error"]):
        assert error["code"] == "engine_http_400"
        assert re.search(rf"\(400\): proxy {re.escape(HIDDEN)} said no$", error["message"])
