"""fairq's OpenAI-compatible Batch API: files, batches, and the RQ jobs that run them.

    files      the Files API's storage (Redis: metadata hash + data string)
    store      the batch object, its status moves and listing
    lines      checking an input line; the output and error records (pure)
    reading    a stored file line by line, block by block
    ingest     a batch's file into band-"batch" jobs (validating -> in_progress)
    harvest    collecting ended lines; stopping the lines of a cancelled/expired batch
    finalize   the output and error files; the end status
    steps      the state machine one RQ job advances a batch by
    context    what a step works with, and the lease that makes it the only one
    jobs       the RQ jobs on queue "fairq-batch" and the sweep that enqueues them
    worker     the batch worker (RQ SimpleWorker + sweep + in-process scheduler)

The gateway imports ``FileStore`` and ``BatchStore``; the CLI ``run_batch_worker``.
"""

from broker.batch.errors import BatchError, NotCancellable
from broker.batch.files import FileRecord, FileStore
from broker.batch.lines import KINDS
from broker.batch.store import BatchRecord, BatchStore

__all__ = [
    "KINDS",
    "BatchError",
    "BatchRecord",
    "BatchStore",
    "FileRecord",
    "FileStore",
    "NotCancellable",
]
