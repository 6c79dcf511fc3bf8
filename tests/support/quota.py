"""What quota tests share: Redis's clock, whose UTC minutes and days are the quotas'
windows (``broker.quotas``), and a wait that keeps a test's requests in one minute."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from broker.quotas import DAY_MS, MINUTE_MS


async def redis_now_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def within_one_minute(redis: Redis, room_s: float = 3.0) -> int:
    """Redis's time (ms) once its minute has ``room_s`` or more left (waiting for the next
    one if not), so that a test's requests fall in one minute window."""
    now = await redis_now_ms(redis)
    left_ms = MINUTE_MS - now % MINUTE_MS
    if left_ms < room_s * 1000:
        await asyncio.sleep(left_ms / 1000 + 0.05)
        now = await redis_now_ms(redis)
    return now


def day_left_s(now_ms: int) -> float:
    """Seconds until the UTC day of ``now_ms`` ends."""
    return (DAY_MS - now_ms % DAY_MS) / 1000
