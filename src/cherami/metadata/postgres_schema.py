"""The PostgreSQL metadata store's schema (postgres.py): the migrations that make and
change its tables, applied by ``migrate`` under an advisory lock, and the schema name
its connections use."""

from __future__ import annotations

import logging
import re
from typing import LiteralString

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cherami.errors import InvalidRequest

# the store's logger: migrations log as they did inside postgres.py
log = logging.getLogger("cherami.metadata.postgres")


# Applied in order, each once, each in its own transaction; append, never edit.
# Keys are COLLATE "C" so listings sort by code point, as SQLite's BINARY collation does.
def _note_change(create: str, notify: bool) -> str:
    """The trigger function of the change log (MetadataStore.changes_since); with
    ``notify`` each change is also sent on the schema's channel (postgres_notify.py)."""
    notice = (
        "PERFORM pg_notify('cherami_' || left(md5(TG_TABLE_SCHEMA), 16), '');" if notify else ""
    )
    return f"""
    {create} FUNCTION note_change() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        q text;
        n bigint;
    BEGIN
        IF TG_OP = 'DELETE' THEN
            IF TG_TABLE_NAME = 'queues' THEN q := OLD.name; ELSE q := OLD.queue; END IF;
        ELSE
            IF TG_TABLE_NAME = 'queues' THEN q := NEW.name; ELSE q := NEW.queue; END IF;
        END IF;
        UPDATE change_counter SET seq = seq + 1 RETURNING seq INTO n;
        INSERT INTO changes VALUES (n, q);
        DELETE FROM changes WHERE seq <= n - 10000;
        {notice}
        RETURN NULL;
    END $$;
    """


MIGRATIONS: tuple[LiteralString, ...] = (
    """
    CREATE TABLE queues (
        name text COLLATE "C" PRIMARY KEY, config jsonb NOT NULL,
        created_at double precision NOT NULL, dlq_of text
    );
    CREATE TABLE groups (
        queue text COLLATE "C" NOT NULL, name text COLLATE "C" NOT NULL, config jsonb NOT NULL,
        created_at double precision NOT NULL, start_ms bigint NOT NULL, dlq text NOT NULL,
        PRIMARY KEY (queue, name)
    );
    CREATE TABLE extents (
        id text COLLATE "C" PRIMARY KEY, queue text NOT NULL, kind text NOT NULL,
        status text NOT NULL, input_host text NOT NULL, stores text[] NOT NULL,
        created_at double precision NOT NULL, sealed_seq bigint,
        predecessor text UNIQUE
    );
    CREATE INDEX extents_by_queue ON extents (queue, status);
    CREATE TABLE ack_levels (
        queue text NOT NULL, grp text NOT NULL, extent text NOT NULL, level bytea NOT NULL,
        acked bigint NOT NULL, lim bytea, PRIMARY KEY (queue, grp, extent)
    );
    CREATE TABLE hosts (
        id text COLLATE "C" PRIMARY KEY, role text NOT NULL, address text NOT NULL,
        heartbeat_at double precision NOT NULL
    );
    CREATE TABLE leases (
        name text PRIMARY KEY, holder text NOT NULL, expires_at double precision NOT NULL
    );
    """,
    # lease epochs: fenced writes (ack levels, extents) name the epoch they act in
    "ALTER TABLE leases ADD COLUMN epoch bigint NOT NULL DEFAULT 1;",
    # parked messages: delivery counts and nack delays that survive restarts
    """
    CREATE TABLE redeliveries (
        queue text NOT NULL, grp text NOT NULL, extent text COLLATE "C" NOT NULL,
        key bytea NOT NULL, count integer NOT NULL, due_ms bigint NOT NULL,
        PRIMARY KEY (queue, grp, extent, key)
    );
    """,
    # zones and load reports (the hosts' latest, JSON) for placement and scaling
    "ALTER TABLE hosts ADD COLUMN zone text NOT NULL DEFAULT '', ADD COLUMN load jsonb;",
    # every open extent at once (recovery), not queue by queue
    "CREATE INDEX extents_by_status ON extents (status);",
    # the change log (MetadataStore.changes_since): numbered from one counter row, whose
    # lock orders the writers, so numbers become visible in order and without gaps
    """
    CREATE TABLE changes (seq bigint PRIMARY KEY, queue text NOT NULL);
    CREATE TABLE change_counter (one boolean PRIMARY KEY, seq bigint NOT NULL);
    INSERT INTO change_counter VALUES (true, 0);
    """
    + _note_change("CREATE", notify=False)
    + """
    CREATE TRIGGER queues_changed AFTER INSERT OR UPDATE OR DELETE ON queues
        FOR EACH ROW EXECUTE FUNCTION note_change();
    CREATE TRIGGER groups_changed AFTER INSERT OR UPDATE OR DELETE ON groups
        FOR EACH ROW EXECUTE FUNCTION note_change();
    CREATE TRIGGER extents_changed AFTER INSERT OR DELETE OR UPDATE OF status ON extents
        FOR EACH ROW EXECUTE FUNCTION note_change();
    CREATE TRIGGER limit_added AFTER INSERT ON ack_levels
        FOR EACH ROW WHEN (NEW.lim IS NOT NULL) EXECUTE FUNCTION note_change();
    CREATE TRIGGER limit_changed AFTER UPDATE ON ack_levels
        FOR EACH ROW WHEN (NEW.lim IS DISTINCT FROM OLD.lim) EXECUTE FUNCTION note_change();
    CREATE TRIGGER limit_deleted AFTER DELETE ON ack_levels
        FOR EACH ROW WHEN (OLD.lim IS NOT NULL) EXECUTE FUNCTION note_change();
    """,
    # a page of the queues a listing shows (not the groups' DLQs), in name order
    "CREATE INDEX queues_public ON queues (name) WHERE dlq_of IS NULL;",
    # queue properties (properties.py): what is kept with a queue that Cherami never reads
    """
    CREATE TABLE queue_properties (
        queue text COLLATE "C" NOT NULL, name text COLLATE "C" NOT NULL, value text NOT NULL,
        PRIMARY KEY (queue, name)
    );
    CREATE INDEX queue_properties_by_name ON queue_properties (name, value);
    """,
    # timer extents only for the queues that take delayed messages (Queue.timers); a
    # queue made before had them all along
    "ALTER TABLE queues ADD COLUMN timers boolean NOT NULL DEFAULT true;",
    # cancelled delayed messages (tombstones every group honours when they come due)
    """
    CREATE TABLE cancelled (
        queue text NOT NULL, extent text COLLATE "C" NOT NULL, seq bigint NOT NULL,
        PRIMARY KEY (queue, extent, seq)
    );
    """,
    # a cancel is in the change log: output hosts read the queue's tombstones again
    "CREATE TRIGGER cancelled_changed AFTER INSERT ON cancelled "
    "FOR EACH ROW EXECUTE FUNCTION note_change();",
    # a queue that took a keyed message: each of its groups is served whole (Queue.keyed)
    "ALTER TABLE queues ADD COLUMN keyed boolean NOT NULL DEFAULT false;",
    # output hosts' host leases (hostleases.py): a unit whose session is set is held
    # while its holder's row has that session, unexpired
    """
    CREATE TABLE host_leases (
        host text COLLATE "C" PRIMARY KEY, session bigint NOT NULL,
        expires_at double precision NOT NULL
    );
    ALTER TABLE leases ADD COLUMN session bigint;
    """,
    # what a host's takes and releases changed (lease_stamp): an idle output host reads
    # one row a host, not every unit's lease
    "ALTER TABLE host_leases ADD COLUMN changes bigint NOT NULL DEFAULT 0, "
    "ADD COLUMN released_until double precision NOT NULL DEFAULT 0;",
    # each change is notified on the schema's channel (postgres_notify.py): the leading
    # controller acts on it at once, not at its next tick
    _note_change("CREATE OR REPLACE", notify=True),
)

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_MIGRATION_LOCK = 0x43484552  # "CHER": the advisory lock class; the schema hash is the key
# the server's clock in seconds since the epoch, the one clock every host shares
NOW = "extract(epoch FROM clock_timestamp())::double precision"


def check_schema(schema: str) -> str:
    if not _SCHEMA_NAME.match(schema):
        raise InvalidRequest(
            f"schema name {schema!r} must be 1-63 characters from a-z 0-9 _ "
            "not starting with a digit"
        )
    return schema


async def migrate(url: str, schema: str) -> int:
    """Create ``schema`` if missing and apply the migrations it lacks; returns its version.

    An advisory lock serialises processes that start at once against one database."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        # Held until this connection closes.
        await conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_MIGRATION_LOCK, schema))
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version integer PRIMARY KEY, applied_at double precision NOT NULL)"
        )
        cur = await conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations")
        row = await cur.fetchone()
        current: int = row[0] if row else 0
        if current > len(MIGRATIONS):
            log.warning(
                "schema %s is at version %d, newer than this code (%d)",
                schema,
                current,
                len(MIGRATIONS),
            )
        for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
            async with conn.transaction():
                await conn.execute(script)
                await conn.execute(
                    f"INSERT INTO schema_migrations VALUES (%s, {NOW})",
                    (version,),
                )
            log.info("migrated metadata schema %s to version %d", schema, version)
            current = version
        return current


def with_search_path(url: str, schema: str) -> str:
    options = conninfo_to_dict(url).get("options") or ""
    return make_conninfo(url, options=f"{options} -c search_path={schema}".strip())
