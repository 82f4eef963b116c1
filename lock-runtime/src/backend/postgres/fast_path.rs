//! The statements the client sends to lock and to release: each tries the
//! uncontended writer's case as one write of the name's slot 0 (the shape
//! of a lease row's upsert and update), and calls the function when that
//! took or freed nothing, in the same statement, so a call is still one
//! round trip and one transaction.
//!
//! The fast path applies only while slot 0's `busy` flag is false: no other
//! slot live and nobody queued (`sql/schema.sql`). The functions set the
//! flag under slot 0's row lock whenever that stops being so, and this path
//! takes the same row lock (the upsert's conflict, the update), so it never
//! grants beside a reader, a permit or a waiter, and never frees a lock
//! whose release has a queue to serve. What it writes is what the function
//! would write for that case: the same slot, token and lease.

/// `lock_acquire_v1`'s parameters and columns. A writer ($3 = 'w') takes
/// slot 0 if it is free and not busy (a new name is created so), with a
/// fresh token if it asked for one; expired names are swept as the
/// function does. Anything else (a reader, a permit, a busy or held name,
/// this owner's own hold) goes to the function.
pub(super) const ACQUIRE: &str = "\
WITH c AS (SELECT clock_timestamp() AS now),
f AS (
    INSERT INTO lock_holders AS h (name, slot, owner, kind, lease_end, fence, last, expires, busy)
    SELECT $1, 0, $2, 'w', c.now + $5 * interval '1 millisecond',
           CASE WHEN $8 THEN (extract(epoch FROM c.now) * 1000000)::bigint ELSE 0 END,
           CASE WHEN $8 THEN (extract(epoch FROM c.now) * 1000000)::bigint ELSE 0 END,
           c.now + $10 * interval '1.5 millisecond', false
      FROM c WHERE $3 = 'w'
    ON CONFLICT (name, slot) DO UPDATE
       SET owner = EXCLUDED.owner, kind = 'w', lease_end = EXCLUDED.lease_end,
           fence = CASE WHEN $8 THEN greatest(h.last + 1, EXCLUDED.last) ELSE 0 END,
           last = CASE WHEN $8 THEN greatest(h.last + 1, EXCLUDED.last) ELSE h.last END,
           expires = CASE WHEN h.expires < EXCLUDED.expires - $10 * interval '0.5 millisecond'
                          THEN EXCLUDED.expires ELSE h.expires END,
           kept = false, handed_by = NULL
     WHERE h.lease_end <= EXCLUDED.lease_end - $5 * interval '1 millisecond' AND h.busy IS FALSE
    RETURNING h.fence),
s AS (
    SELECT lock_sweep_v1(c.now, $10 * interval '1 millisecond')
      FROM c, f
     WHERE EXISTS (SELECT 1 FROM lock_holders WHERE slot = 0 AND expires < c.now))
SELECT 1, f.fence, NULL::bigint, 0::bigint FROM f LEFT JOIN s ON true
UNION ALL
SELECT * FROM lock_acquire_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
 WHERE NOT EXISTS (SELECT 1 FROM f)";

/// `lock_release_v1`'s parameters and its answer. The holder's own slot 0,
/// not kept, not busy, not forced: freed, committed without waiting for
/// the WAL flush (nothing handed over, as the function does). Anything
/// else goes to the function.
pub(super) const RELEASE: &str = "\
WITH f AS (
    UPDATE lock_holders
       SET owner = '', lease_end = '-infinity', kept = false, handed_by = NULL,
           fence = CASE WHEN lease_end > clock_timestamp() THEN 1 ELSE 0 END
     WHERE name = $1 AND slot = 0 AND owner = $2 AND NOT kept AND busy IS FALSE AND NOT $3
    RETURNING fence)
SELECT f.fence::integer, set_config('synchronous_commit', 'off', true) FROM f
UNION ALL
SELECT lock_release_v1($1, $2, $3), NULL WHERE NOT EXISTS (SELECT 1 FROM f)";
