"""The Batch API (``broker/batch``): files, batches and the RQ batch workers."""

from __future__ import annotations

from pydantic import Field, model_validator

from broker.errors import SettingError
from broker.settings._base import Frozen

_DAY_S = 86400


class BatchSettings(Frozen):
    """Limits of the Batch API's files and batches, and the pace of its batch workers."""

    max_file_bytes: int = Field(
        default=200 * 1024 * 1024,
        ge=1024,
        description="Largest upload in bytes, beyond which 413 (200 MiB; OpenAI's limit is "
        "200 MB). Files live "
        "in Redis: each costs about its size in memory.",
    )
    owner_max_bytes: int = Field(
        default=1 << 30,
        ge=1024,
        description="Bytes of files one owner (a key's user) may hold, beyond which an upload "
        "is refused with 429 files_quota_exceeded (1 GiB: five full-size batch files). Files "
        "live in a noeviction Redis that every request shares: a full Redis refuses everyone, "
        "so the sum over owners must fit beside the queues. A batch's output and error files "
        "count, but are never refused.",
    )
    owner_max_files: int = Field(
        default=1000,
        ge=1,
        description="Files one owner may hold, beyond which an upload is refused with 429 "
        "files_quota_exceeded (each file costs Redis keys however small; listing walks them).",
    )
    file_keep_s: int = Field(
        default=30 * _DAY_S,
        ge=60,
        description="An upload expires this long after it was made unless its expires_after "
        "asks for less (OpenAI's default for purpose=batch: 30 days); also the longest "
        "expires_after allowed. A batch keeps its input file until the batch's own window "
        "and line_keep_s have passed, however early the file was to expire.",
    )
    output_file_keep_s: int = Field(
        default=30 * _DAY_S,
        ge=60,
        description="A batch's output and error files expire this long after the batch wrote them.",
    )
    max_lines: int = Field(
        default=50_000, ge=1, description="Lines of one batch file (OpenAI's limit)."
    )
    max_queued_lines_per_user: int = Field(
        default=1_000_000,
        ge=1,
        description="Batch lines queued per user, in band batch, under this cap instead of "
        "max_queued_per_user: a 50,000-line batch must not be refused by the interactive "
        "cap.",
    )
    line_keep_s: int = Field(
        default=3 * 86400,
        ge=60,
        description="A finished line's job record and result are kept this long (instead "
        "of result_ttl_s), so that its batch collects them even after a long batch-worker "
        "outage.",
    )
    completion_windows: dict[str, int] = Field(
        default_factory=lambda: {"24h": 86400},
        description="The completion windows a batch may ask for, each in seconds.",
    )
    ingest_chunk_lines: int = Field(
        default=500, ge=1, description="Lines queued per step of a batch's ingest."
    )
    harvest_window: int = Field(
        default=512, ge=1, description="Lowest pending lines of a batch checked per pass."
    )
    sweep_interval_s: int = Field(
        default=1, ge=1, description="How often a batch worker advances each batch."
    )
    lease_s: int = Field(
        default=15,
        ge=2,
        description="A dead batch worker's batch is taken over after this.",
    )
    step_max_tries: int = Field(
        default=8,
        ge=1,
        description="Steps of a batch that may fail in a row, each retried twice as late as "
        "the one before (from sweep_interval_s, at most a minute); then the batch fails "
        "with the error.",
    )
    read_block_bytes: int = Field(
        default=1 << 20, ge=1024, description="Bytes read from a batch file at once."
    )

    @model_validator(mode="after")
    def _a_file_fits_the_quota(self) -> BatchSettings:
        if self.max_file_bytes > self.owner_max_bytes:
            raise SettingError(
                ("owner_max_bytes",),
                f"must be at least batch.max_file_bytes ({self.max_file_bytes}): "
                "else no upload of the largest size could ever be held",
            )
        return self
