"""``fairq bench tenants``: a multi-tenant load harness for any OpenAI-compatible base URL.

It drives fairq, a peer gateway or an engine straight with the same plan
(``benchmarks.tenants.plan``), records every request's first token and token arrivals
(``benchmarks.tenants.client``), and reports per class TTFT and inter-token latency
p50/p95/p99, per tenant the realised share of output tokens against its weight with
Jain's index over fixed windows, batch completion, and the engine's steps for the work
against straight FIFO (``benchmarks.tenants.figures``, ``benchmarks.tenants.report``).
An arm with a failed request fails.
"""
