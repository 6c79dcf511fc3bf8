"""A minimal streaming pass-through proxy: the "usual Python proxy" baseline of the benchmark.

What a typical Python LLM proxy does at least: a FastAPI route that forwards the
request body to the engine with httpx and streams the engine's SSE back, chunk
by chunk, through a ``StreamingResponse``. No auth, no queue, no parsing: the
least such a proxy can cost per chunk. Served by uvicorn like fairq's gateway.

Run with ``python -m benchmarks.streaming.proxy --port P --upstream http://127.0.0.1:Q``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import click
import httpx
import uvicorn
from fastapi import FastAPI, Request
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse


def make_app(upstream: str) -> FastAPI:
    app = FastAPI()
    limits = httpx.Limits(max_connections=None)
    client = httpx.AsyncClient(base_url=upstream, timeout=60, limits=limits)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        upstream_request = client.build_request(
            "POST", "/v1/chat/completions", content=await request.body(),
            headers={"content-type": "application/json"},
        )  # fmt: skip
        response = await client.send(upstream_request, stream=True)

        async def body() -> AsyncIterator[bytes]:
            async for chunk in response.aiter_raw():
                yield chunk

        return StreamingResponse(
            body(), media_type="text/event-stream", background=BackgroundTask(response.aclose)
        )

    return app


@click.command()
@click.option("--port", type=int, required=True)
@click.option("--upstream", required=True)
def main(port: int, upstream: str) -> None:
    uvicorn.run(make_app(upstream), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
