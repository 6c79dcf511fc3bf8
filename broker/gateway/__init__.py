"""fairq's OpenAI-compatible HTTP gateway (FastAPI on uvicorn).

    app          the application and its lifespan
    state        the per-process resources (Redis, queue, result reader, key ring)
    auth, body   the caller's key; a size-bounded request body
    completions  POST /v1/chat/completions and /v1/completions
    sse          the streaming hot path (byte pass-through)
    followed     a submitted job followed to its end; cancelled if its client leaves
    outcomes     failed / cancelled / expired jobs as OpenAI errors (status codes)
    jobs         GET and DELETE /v1/jobs/{id}
    models       GET /v1/models
    health       /healthz, /readyz
    admin        /metrics, /admin/status (admin keys), /dashboard (static page)
    errors       OpenAI-shaped error bodies for everything, including 404/405/500
    server       serve(): uvicorn in the foreground, clean exit on SIGINT/SIGTERM

Only ``create_app`` and ``serve`` are public.
"""

from broker.gateway.app import create_app
from broker.gateway.server import serve

__all__ = ["create_app", "serve"]
