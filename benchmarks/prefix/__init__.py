"""``fairq bench prefix``: prefix-aware routing against least-loaded, side by side."""
