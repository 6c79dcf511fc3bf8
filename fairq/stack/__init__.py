"""The local stack of ``fairq up``: every component as its own process (``processes``),
started by one thread that outlives them (``children``); a private Redis or Redis Cluster
on loopback (``localredis``, ``localcluster``) that carries its stack's claim
(``owner``); what ``fairq up`` runs from its flags or a file (``upconfig``); and the wait
for a model's first answer (``answering``)."""
