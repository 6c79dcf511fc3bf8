"""Streaming and latency: CPU per streamed token, fan-out, added latency, the client flood."""
