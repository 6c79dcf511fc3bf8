"""The fields of a batch's hash (``fq:batch:{id}``), as Redis holds them.

The hash keeps OpenAI's names for what the batch object shows (``BatchRecord.public``);
the rest are fairq's own. Python names a field by these constants, the Lua scripts write
the few they touch as literals (a script cannot import): a test holds both to this module
(tests/broker/test_batch_fields.py), as ``broker.job_fields`` is held for a job's hash.
"""

# OpenAI's batch object
STATUS = "status"
ENDPOINT = "endpoint"
INPUT_FILE_ID = "input_file_id"
COMPLETION_WINDOW = "completion_window"
CREATED_AT = "created_at"
EXPIRES_AT = "expires_at"
OUTPUT_FILE_ID = "output_file_id"
ERROR_FILE_ID = "error_file_id"
ERRORS = "errors"  # OpenAI's errors object, JSON
METADATA = "metadata"  # JSON
MODEL = "model"  # the first line's model
TOTAL = "total"  # request_counts: lines in the file, once read to its end
COMPLETED = "completed"  # ... lines ended well (batch_record.lua counts them)
FAILED = "failed"  # ... lines that failed
# When the batch moved to each status (batch_status.lua stamps the one it moves to)
IN_PROGRESS_AT = "in_progress_at"
FINALIZING_AT = "finalizing_at"
COMPLETED_AT = "completed_at"
FAILED_AT = "failed_at"
EXPIRED_AT = "expired_at"
CANCELLING_AT = "cancelling_at"
CANCELLED_AT = "cancelled_at"
TIMES = (
    IN_PROGRESS_AT,
    FINALIZING_AT,
    COMPLETED_AT,
    FAILED_AT,
    EXPIRED_AT,
    CANCELLING_AT,
    CANCELLED_AT,
)

# fairq's: the creating key's entitlement
OWNER = "owner"
TENANT = "tenant"
WEIGHT = "weight"
MODELS = "models"  # the models the key may use, JSON (null: any)
# The ingest cursor
OFFSET = "off"  # the input file's byte offset read to
LINE = "line"  # lines read
QUEUED = "queued"  # lines queued as jobs
# Expiry
EXPIRING = "expiring"  # 1: the window passed; the next step expires it
EXPIRY_SCHEDULED = "xs"  # 1: its expiry is scheduled with RQ
# Steps failed in a row and the last one's error (``batch.failures``)
STEP_FAILS = "step_fails"
STEP_ERROR = "step_error"
