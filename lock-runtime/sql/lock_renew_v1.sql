-- The watchdog's tick: extend every hold in the batch (names, owners and
-- leases in ms, as three arrays of one length) by its lease from now, in
-- one statement. Returns the 1-based positions of the holds it extended;
-- a hold not among them is gone (lapsed, released, or forced out).
-- First locks the rows in (name, slot) order, as every call that locks
-- more than one slot of a name does (slot 0 first), so that two holds of
-- one name in the batch do not deadlock with a call on that name; then
-- checks each lease again, on rows now its own and by the clock of that
-- moment: a row another call only locked (it found the lease over and
-- took the name) is never extended by a check made before the wait.
-- Writes lease_end of live, not kept lock_holders rows only: no index
-- covers it, so each is a HOT update. Safe to send twice: a second send
-- sets the same leases again from its own now.
CREATE OR REPLACE FUNCTION lock_renew_v1(p_names text[], p_owners text[], p_leases_ms bigint[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1
       FROM lock_holders h
       JOIN unnest(p_names, p_owners) AS u(name, owner)
         ON h.name = u.name AND h.owner = u.owner
      WHERE NOT h.kept AND h.lease_end > clock_timestamp()
      ORDER BY h.name, h.slot
        FOR NO KEY UPDATE OF h;
    RETURN QUERY
    UPDATE lock_holders h
       SET lease_end = clock_timestamp() + u.lease_ms * interval '1 millisecond'
      FROM unnest(p_names, p_owners, p_leases_ms) WITH ORDINALITY AS u(name, owner, lease_ms, i)
     WHERE h.name = u.name AND h.owner = u.owner AND NOT h.kept AND h.lease_end > clock_timestamp()
    RETURNING u.i;
END
$$;
