"""Helpers the tests share: servers on 127.0.0.1, the stack's parts, paths, polling."""
