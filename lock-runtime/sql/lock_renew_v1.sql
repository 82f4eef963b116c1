-- The watchdog's tick: extend every hold in the batch (names, owners and
-- leases in ms, as three arrays of one length) by its lease from now, in
-- one statement. Returns the 1-based positions of the holds it extended;
-- a hold not among them is gone (lapsed, released, or forced out).
-- Locks the rows in (name, slot) order first, as every other call that
-- locks more than one slot of a name does (slot 0 first), so that two
-- holds of one name in the batch never deadlock with a call on that name.
-- Writes lease_end of live, not kept lock_holders rows only: no index
-- covers it, so each is a HOT update. Safe to send twice: a second send
-- sets the same leases again from its own now.
CREATE OR REPLACE FUNCTION lock_renew_v1(p_names text[], p_owners text[], p_leases_ms bigint[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    WITH live AS (
        SELECT h.name, h.slot, u.lease_ms, u.i
          FROM lock_holders h
          JOIN unnest(p_names, p_owners, p_leases_ms) WITH ORDINALITY AS u(name, owner, lease_ms, i)
            ON h.name = u.name AND h.owner = u.owner
         WHERE NOT h.kept AND h.lease_end > clock_timestamp()
         ORDER BY h.name, h.slot
           FOR NO KEY UPDATE OF h)
    UPDATE lock_holders h
       SET lease_end = clock_timestamp() + l.lease_ms * interval '1 millisecond'
      FROM live l
     WHERE h.name = l.name AND h.slot = l.slot
    RETURNING l.i;
$$;
