"""fairq's Redis transport: clients made from the settings, the lean RESP connection of
the hot paths, the packed pipeline, Redis Cluster routing, and reply decoding.

    connect    clients from the settings (single server or cluster)
    options    the options every client shares; the plain client of a blocking loop
    cluster    what differs on a Redis Cluster (per-slot routing, scripts in pipelines)
    resp       the lean asyncio connection (replies parsed by hiredis)
    packed     a pipeline packed by hand for the streaming hot path
    replies    redis-py replies as the bytes fairq reads
"""
