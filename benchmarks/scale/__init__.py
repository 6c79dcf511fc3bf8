"""Throughput and scale: dispatch rate, queue depth, job rate against RQ, scrapes, idle cost."""
