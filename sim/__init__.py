"""Engine simulator: a stand-in vLLM 0.32 pod for local runs, tests and benchmarks.

It speaks vLLM's OpenAI-compatible HTTP API and /metrics, and models continuous
batching from a profile. Its timings and metric values are estimates, not
measurements of a real engine. Of fairq it uses only `broker.QuietSignalServer`.
"""

from sim._app import create_app
from sim._errors import ProfileError, SimError
from sim._profile import SimProfile, load_profile
from sim._scheduler import SchedSeq, Scheduler
from sim._server import serve
from sim._wire import WORDS, output_text

# Beside the server: the scheduler alone, for a bound on paper
# (``benchmarks/fairness/fill_bound.py``), and the text the simulator writes, for checks
# that an answer taken back and resumed reads as one.
__all__ = [
    "WORDS",
    "ProfileError",
    "SchedSeq",
    "Scheduler",
    "SimError",
    "SimProfile",
    "create_app",
    "load_profile",
    "output_text",
    "serve",
]
