-- Record that this session listens on p_channel (a client's channel), after
-- its LISTEN, and drop up to 16 records of sessions that are gone.
-- Reads pg_stat_activity; writes lock_listeners. Safe to send twice: it
-- records the same session again.
CREATE OR REPLACE FUNCTION lock_listen_v1(p_channel text)
RETURNS void LANGUAGE sql AS $$
    DELETE FROM lock_listeners WHERE channel IN (
        SELECT l.channel FROM lock_listeners l
         WHERE l.channel <> p_channel AND NOT EXISTS (
               SELECT 1 FROM pg_stat_get_activity(l.pid) a
                WHERE a.backend_start IS NULL OR a.backend_start = l.started)
         LIMIT 16);
    INSERT INTO lock_listeners (channel, pid, started)
    SELECT p_channel, pg_backend_pid(), backend_start
      FROM pg_stat_get_activity(pg_backend_pid())
    ON CONFLICT (channel) DO UPDATE SET pid = EXCLUDED.pid, started = EXCLUDED.started;
$$;
