"""Helpers the tests share, one of each: ``settings`` (the one settings builder),
``eventually`` (the one way to wait), ``stack`` (every part of a stack, started one way),
``servers`` (servers on 127.0.0.1), ``paths``; and for single suites ``contract`` (the
broker contract's model), ``cdp``, ``tlsproxy``, ``kustomize``."""
