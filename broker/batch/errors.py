"""The errors of the Batch API::

FairqError (broker.errors)
├── NotFound                 404: a file or batch that is not the caller's (or none)
├── BodyTooLarge             413: an upload over ``batch.max_file_bytes``
└── BatchError               the root of this package's own errors
    ├── NotCancellable       409: the batch has ended or is ending already
    ├── FilesQuotaExceeded   429: an upload past its owner's bytes or files
    └── LeaseLost            a batch step found that another job took the batch over
                             (never reaches a client: the step just stops)
"""

from __future__ import annotations

from broker.errors import FairqError


class BatchError(FairqError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_batch"


class NotCancellable(BatchError):
    status = 409
    code = "batch_not_cancellable"


class FilesQuotaExceeded(BatchError):
    """An upload would pass what its owner may hold (``batch.owner_max_bytes`` or
    ``batch.owner_max_files``). Final: only deleting files (or their expiry) frees space,
    so the client is told not to retry by itself."""

    status = 429
    code = "files_quota_exceeded"
    final = True


class LeaseLost(BatchError):
    code = "batch_lease_lost"
