"""Engine simulator: a stand-in vLLM 0.32 pod for local runs, tests and benchmarks.

It speaks vLLM's OpenAI-compatible HTTP API and /metrics, and models continuous
batching from a profile. Its timings and metric values are estimates, not
measurements of a real engine. Of fairq it uses only `broker.QuietSignalServer`.
"""

from workers.sim._app import create_app
from workers.sim._errors import ProfileError, SimError
from workers.sim._profile import SimProfile, load_profile
from workers.sim._server import serve

__all__ = ["ProfileError", "SimError", "SimProfile", "create_app", "load_profile", "serve"]
