"""The Batch API: ingesting a large batch file, and interactive TTFT while a batch runs."""
