"""fairq's OpenAI-compatible HTTP gateway (FastAPI on uvicorn).

    app          the application and its lifespan
    state        the per-process resources (Redis, queue, result reader, key ring)
    auth, body   the caller's key; a size-bounded request body
    completions  POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses
    sse          the streaming hot path (byte pass-through)
    followed     a submitted job followed to its end; cancelled if its client leaves
    outcomes     failed / cancelled / expired jobs as OpenAI errors (status codes)
    jobs         GET and DELETE /v1/jobs/{id}
    models       GET /v1/models
    health       /healthz, /readyz
    admin        /metrics, /admin/status (admin keys), /dashboard (static page)
    errors       OpenAI-shaped error bodies for everything, including 404/405/500
    server       GatewayServer: uvicorn that drains the gateway on SIGINT/SIGTERM;
                 gateway_config: its uvicorn settings
    connections  the limits on HTTP connections (timeouts, how many, bodies after a 413)

``fairq.services`` runs the public names below; the tests serve the same way.
"""

from gateway.app import create_app
from gateway.connections import make_room
from gateway.server import GRACEFUL_SHUTDOWN_S, GatewayServer, gateway_config

__all__ = ["GRACEFUL_SHUTDOWN_S", "GatewayServer", "create_app", "gateway_config", "make_room"]
