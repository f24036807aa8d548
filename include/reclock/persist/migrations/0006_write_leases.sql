-- A write (a cycle's write_batches, a rebuild) leases the folder it puts parts under until its append or
-- swap is done: garbage collection leaves a leased folder alone while the lease is fresh, however long the
-- write takes. A lease not renewed within the grace period (its writer died) no longer protects anything.
CREATE TABLE reclock.write_leases (
    prefix      text PRIMARY KEY,
    source      text NOT NULL,
    renewed_at  timestamptz NOT NULL DEFAULT now()
);
-- when garbage collection last ran over a source's folders (resume runs it every so often)
ALTER TABLE reclock.sources ADD COLUMN gc_at timestamptz;
