"""Helpers every long-running fairq process uses: the tuned garbage collector, the quiet
uvicorn server, stopping background tasks, and the one-consumer mailbox.
"""
