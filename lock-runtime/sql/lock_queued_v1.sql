-- Whether p_owner still waits in the name's queue, or holds the lock (a
-- release handed it over). Reads lock_waiters and lock_holders; writes
-- nothing, so sending it twice is harmless.
CREATE OR REPLACE FUNCTION lock_queued_v1(p_name text, p_owner text)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT 1 FROM lock_waiters
                    WHERE name = p_name AND owner = p_owner AND until > clock_timestamp())
        OR EXISTS (SELECT 1 FROM lock_holders
                    WHERE name = p_name AND owner = p_owner AND NOT kept
                      AND lease_end > clock_timestamp());
$$;
