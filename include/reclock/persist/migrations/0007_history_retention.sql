-- statistics and status rows are kept for a while (RECLOCK_STATS_RETAIN_S), then pruned by resume's
-- garbage-collection pass (reclock.persist.status.prune_history): these indexes find the old ones
CREATE INDEX statistics_at ON reclock.statistics (at);
CREATE INDEX status_history_at ON reclock.status_history (at);
