-- The tables of the PostgreSQL engine, in the schema the connection's
-- search_path names first. Created by the client on first use; teams that
-- migrate by hand apply this file and the functions beside it (the
-- `lock_*_v1.sql` files), in one transaction.
-- Safe to run twice: every statement is IF NOT EXISTS.
--
-- lock_holders: the slots of a name, one per hold (a writer, each reader,
-- each permit of a semaphore), with its lease end by the database's clock.
-- A hold takes the name's free slot (released, or its lease over) and a
-- release frees it (owner '', lease_end -infinity, fence 1 if it ended in
-- its lease, else 0): slots are used again, not inserted and deleted, so a
-- lock cycle, like a renewal, only updates columns no index covers (HOT
-- updates, room left on each page by the fill factor) and the table does
-- not bloat. A name's slots go with its lock_fences row (lock_sweep_v1).
-- kind: 'w' writer, 'r' reader, 's' permit. kept: its holder released it
-- under min_hold; it stays taken until lease_end, renewed by nobody.
-- handed_by: the owner whose release handed it over (a release sent twice
-- knows it ran). An owner has one slot of a name at most.
CREATE TABLE IF NOT EXISTS lock_holders (
    name      text        NOT NULL,
    slot      integer     NOT NULL,
    owner     text        NOT NULL,
    kind      "char"      NOT NULL,
    lease_end timestamptz NOT NULL,
    fence     bigint      NOT NULL,
    kept      boolean     NOT NULL DEFAULT false,
    handed_by text,
    PRIMARY KEY (name, slot)
) WITH (fillfactor = 50);

-- lock_fences: per lock name, the last token handed out (tokens rise per
-- name, floored at the database clock in microseconds) and when the row may
-- go: at least fence_ttl after the name's last acquisition. Every call that
-- changes a name locks this row first, which orders them. The expiry moves
-- only when less than fence_ttl is left, so most token updates stay HOT.
CREATE TABLE IF NOT EXISTS lock_fences (
    name    text        PRIMARY KEY,
    last    bigint      NOT NULL,
    expires timestamptz NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS lock_fences_expires ON lock_fences (expires);

-- lock_waiters: the queue of a name, first come first served (seq), each
-- waiter with its client's LISTEN channel, the lease its grant gets, and
-- how long it stays queued.
CREATE TABLE IF NOT EXISTS lock_waiters (
    name     text        NOT NULL,
    owner    text        NOT NULL,
    seq      bigint      GENERATED ALWAYS AS IDENTITY,
    kind     "char"      NOT NULL,
    permits  integer     NOT NULL,
    lease_ms bigint      NOT NULL,
    fenced   boolean     NOT NULL,
    channel  text        NOT NULL,
    until    timestamptz NOT NULL,
    PRIMARY KEY (name, owner)
);

-- lock_listeners: which session listens on each client's channel (its
-- backend pid and start), so that a release hands the lock only to a
-- waiter whose client can hear it, and passes over one whose client died.
CREATE TABLE IF NOT EXISTS lock_listeners (
    channel text        PRIMARY KEY,
    pid     integer     NOT NULL,
    started timestamptz
);
