"""Which model of a shared engine sends the next job (pure, no I/O).

Models served by one engine (``broker.engines``) share its room: one queue target, one
batch. The rule between them is the one fairq keeps between users, one level up:

* strict priority between bands: the most urgent band backlogged in any of the models
  goes first, as inside one model (a model whose top band is less urgent waits, even
  while the more urgent one cannot send);
* among the models backlogged in that band, the room goes in turn, starting after the
  model served last, each turn an equal share of the room open then (one job
  each while the room is small, so a model with one job waiting is served before another
  model is served twice in a row; a large room in a few turns, not one per job);
* inside a model, its own fair pick (``dispatcher.fairness``) chooses the user.

So each model gets an equal share of the engine while several are backlogged, whatever
its number of users; the users of one model share that model's part.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def next_turn(
    order: Sequence[str],
    tops: Mapping[str, int],
    after: str | None,
    done: Collection[str] = (),
) -> str | None:
    """The model that sends the next job, or None when none may.

    ``order``: the models of the engine, in configuration order; ``tops``: model -> its
    most urgent backlogged band (0 the most urgent; a model without backlog is absent);
    ``after``: the model served last (None: none yet); ``done``: models that found no room
    this round (they get no more turns in it, but their band still outranks less urgent
    ones: strict priority).
    """
    if not tops:
        return None
    band = min(tops.values())
    start = order.index(after) + 1 if after in order else 0
    for model in [*order[start:], *order[:start]]:
        if tops.get(model) == band and model not in done:
            return model
    return None
