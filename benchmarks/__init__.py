"""fairq's benchmarks: each compares fairq with its baseline side by side in one run."""
