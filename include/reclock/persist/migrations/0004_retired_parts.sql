-- Parts that lost their batch row to a rebuild (replace_batches) or a compaction (merge_batches), and when.
-- Garbage collection counts a replaced part's grace period from here, not from the blob's write time:
-- a reader that listed a shard's parts just before the swap may still be opening it.
CREATE TABLE reclock.retired_parts (
    path        text PRIMARY KEY,
    retired_at  timestamptz NOT NULL DEFAULT now()
);
