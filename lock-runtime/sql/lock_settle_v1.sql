-- Set slot 0's busy flag of a name to what is so: true while another slot is
-- live or a waiter is queued, else false (the fast path may then take and
-- free the name in one write of slot 0). A renewal in flight of a slot that
-- looks over is waited for first, and the slot stays locked: a renewal after
-- it checks the lease again and finds it over (lock_renew_v1), so a slot
-- counted over is never renewed. p_now: the caller's clock, whose view of
-- the slots this is; a slot live at p_now counts even if it ends just after.
-- Reads lock_holders and lock_waiters; writes slot 0's busy only when it
-- changes. Called by lock_acquire_v1 and lock_release_v1, which have locked
-- slot 0, inside their one statement: sent twice, it sets the same.
CREATE OR REPLACE FUNCTION lock_settle_v1(p_name text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_busy boolean;
BEGIN
    PERFORM 1 FROM lock_holders
     WHERE name = p_name AND slot <> 0 AND owner <> '' AND lease_end <= p_now
     ORDER BY slot
       FOR NO KEY UPDATE;
    v_busy := EXISTS (SELECT 1 FROM lock_holders
                       WHERE name = p_name AND slot <> 0 AND lease_end > p_now)
           OR EXISTS (SELECT 1 FROM lock_waiters WHERE name = p_name);
    UPDATE lock_holders SET busy = v_busy
     WHERE name = p_name AND slot = 0 AND busy IS DISTINCT FROM v_busy;
END
$$;
