"""The batch worker: an RQ worker on queue ``fairq-batch`` that runs OpenAI batches.

    ingest     a batch's file into band-"batch" jobs (validating -> in_progress)
    harvest    collecting ended lines; stopping the lines of a cancelled/expired batch
    finalize   the output and error files; the end status
    steps      the state machine one RQ job advances a batch by
    context    what a step works with, and the lease that makes it the only one
    jobs       the RQ jobs on queue "fairq-batch" and the sweep that enqueues them
    worker     the RQ SimpleWorker with the sweep and the in-process scheduler

Files and batches are stored through ``broker.batch`` (which the gateway reads too).
"""

from batch.worker import BatchWorker

__all__ = ["BatchWorker"]
