-- The tables of the PostgreSQL engine, in the schema the connection's
-- search_path names first. Created by the client on first use; teams that
-- migrate by hand apply this file and the functions beside it (the
-- `lock_*_v1.sql` files), in one transaction.
-- Safe to run twice: every statement is IF NOT EXISTS.
--
-- lock_holders: per lock name, its slots, one per hold (a writer, each
-- reader, each permit of a semaphore), with its lease end by the database's
-- clock. A hold takes the name's free slot (released, or its lease over) and
-- a release frees it (owner '', lease_end -infinity, fence 1 if it ended in
-- its lease, else 0): slots are used again, not inserted and deleted, so a
-- lock cycle, like a renewal, only updates columns no index covers (HOT
-- updates, room left on each page by the fill factor) and the table does
-- not bloat.
-- kind: 'w' writer, 'r' reader, 's' permit. kept: its holder released it
-- under min_hold; it stays taken until lease_end, renewed by nobody.
-- handed_by: the owner whose release handed it over (a release sent twice
-- knows it ran). An owner has one slot of a name at most; a writer's is
-- always slot 0 (it takes a name only when no slot is live, and the first
-- free slot then is 0).
-- Slot 0 is also the name's own row, there as long as the name is: last,
-- the last token handed out (tokens rise per name, floored at the database
-- clock in microseconds); expires, when the name may go (at least fence_ttl
-- after its last acquisition; moved only when less than fence_ttl is left,
-- so most lock cycles stay HOT); busy, set whenever another slot may be
-- live or a waiter may be queued (cleared by the functions once neither
-- is so). Every call that takes, frees or queues for a name locks its
-- slot 0 first, which orders them (a renewal or a min_hold changes only
-- its own slots); while busy is false, a writer's lock and its release are
-- one write of that one row (the client's fast path: an upsert, an
-- update), as a lease row's are.
-- The other slots leave last, expires and busy NULL.
CREATE TABLE IF NOT EXISTS lock_holders (
    name      text        NOT NULL,
    slot      integer     NOT NULL,
    owner     text        NOT NULL,
    kind      "char"      NOT NULL,
    lease_end timestamptz NOT NULL,
    fence     bigint      NOT NULL,
    kept      boolean     NOT NULL DEFAULT false,
    handed_by text,
    last      bigint,
    expires   timestamptz,
    busy      boolean,
    PRIMARY KEY (name, slot)
) WITH (fillfactor = 50);
CREATE INDEX IF NOT EXISTS lock_holders_expires ON lock_holders (expires) WHERE slot = 0;

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
