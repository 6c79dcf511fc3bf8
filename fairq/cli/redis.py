"""``fairq redis``: only the private Redis that ``fairq up`` starts, in the foreground.

Every component refuses to start without ``FAIRQ_REDIS_URL``; to run them by hand
(``fairq api``, ``dispatcher``, ``worker``, ``batch-worker``, each in its own shell)
without a Redis of one's own, this serves one and prints its URL and the export line.
It is ``fairq.stack.localredis.LocalRedis`` as ``fairq up`` runs it: on 127.0.0.1 only,
append-only file fsynced every second, its files in a temporary directory that is
deleted when it stops. Ctrl-C or SIGTERM stops it (the server first, then this
command, exit 0); the server also dies with this command if it is killed outright.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time

import click

from fairq.runtime import environment
from fairq.stack.localredis import LocalRedis

_POLL_S = 0.5


@click.command(epilog=environment())
@click.option(
    "--port", type=click.IntRange(1, 65535), default=None, help="on 127.0.0.1 [a free port]"
)
def redis(port: int | None) -> None:
    """Run only fairq's private Redis (for the components run by hand); Ctrl-C stops it.

    It prints its URL and the line to export in the shells that run the components. Its
    data lives only as long as it runs.
    """
    # Started as a shell's background job, SIGINT is ignored: set both signals outright.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = LocalRedis(port, die_with_parent=True)
    try:
        process = server.start().process
        assert process is not None
        say(f"ready at {server.url} (private: its data is gone when it stops; Ctrl-C stops it)")
        click.echo("in each shell that runs a component:")
        click.echo(f"  export FAIRQ_REDIS_URL={shlex.quote(server.url)}")
        while (code := process.poll()) is None:
            time.sleep(_POLL_S)
        say(f"the Redis server exited on its own (code {code})")
        sys.exit(1)
    except KeyboardInterrupt:
        say("stopping")
    finally:
        server.stop()
    say("stopped")


def say(line: str) -> None:
    click.echo(f"fairq redis: {line}")
