"""Staged parts: the one protocol by which ranks hand their work to rank 0.

Tiling (`tiling.tiler.staging`: a source's part), a distributed prediction
(`landcover.prediction.parts`: a rank's rows) and a tiled map product
(`landcover.prediction.tilerecords`: a tile) all run it; docs/CONTRACTS.md, "Staged parts",
is the contract. In five steps:

1. **Key** (`keys.content_key`): a digest of everything a part's bytes depend on; it is in
   the part's name, so a part of other inputs or options is never asked for.
2. **Publish** (`folder.StagedFolder`): a part's files are put in place whole: on local disk
   and NFS written under a temporary name, fsynced and renamed; on blob storage one upload.
3. **Completion record** (`record`): written after the files it vouches for; a part counts
   only when its record is readable, names this key and its files have the recorded sizes (a
   tiling part, one source's chips, is its own record: its body ends with its key and a crc32c).
4. **Wait** (`wait`): the reader polls the folder, on a schedule that depends on whether it
   is local (`tiling.runtime.polling`); no process group, no notification.
5. **Commit**: rank 0 alone builds the output from the parts, then removes the staging
   folder (`StagedFolder.remove`); a rerun keeps every part whose key and record check out.
"""

from tiling.staged.folder import StagedFolder, staging_url
from tiling.staged.keys import content_key
from tiling.staged.record import (
    check_format,
    files_intact,
    publish_record,
    read_record,
    record_header,
)
from tiling.staged.wait import WAIT_LOG_EVERY_S, PollSchedule, poll, wait_for_records, wait_until

__all__ = [
    "WAIT_LOG_EVERY_S",
    "PollSchedule",
    "StagedFolder",
    "check_format",
    "content_key",
    "files_intact",
    "poll",
    "publish_record",
    "read_record",
    "record_header",
    "staging_url",
    "wait_for_records",
    "wait_until",
]
