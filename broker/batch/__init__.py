"""The Batch API's storage in Redis: files, batches, and the records a line ends as.

    files      the Files API's storage (Redis: metadata hash + data string)
    store      the batch object, its status moves and listing
    lines      checking an input line; the output and error records (pure)
    reading    a stored file line by line, block by block

The gateway serves these; the batch worker (``batch``) runs the batches.
"""

from broker.batch.errors import BatchError, FilesQuotaExceeded, NotCancellable
from broker.batch.files import NO_LIMIT, FileRecord, FileStore, Quota, expires_in_s
from broker.batch.lines import KINDS
from broker.batch.store import BatchRecord, BatchStore

__all__ = [
    "KINDS",
    "NO_LIMIT",
    "BatchError",
    "BatchRecord",
    "BatchStore",
    "FileRecord",
    "FileStore",
    "FilesQuotaExceeded",
    "NotCancellable",
    "Quota",
    "expires_in_s",
]
