-- adapters/postgres/_migrations.lua: the schema migrations of the PostgreSQL
-- adapter (lua/sandbox/adapters/postgres.lua), in order. This file IS the
-- migration file: migrate() applies each version not yet in the ledger table
-- sbx_schema_migrations, in one transaction under an advisory lock, so two
-- hosts starting together apply it once. Statements are separate strings
-- (the driver prepares one statement at a time) and hold no placeholders.
-- Never edit an applied migration: add the next version.
return {
  {
    version = 1,
    name = "001_notes",
    statements = {
      [[CREATE TABLE sbx_notes (
          channel    text NOT NULL CHECK (octet_length(channel) BETWEEN 1 AND 256),
          owner      text NOT NULL CHECK (octet_length(owner) <= 258),  -- '' or p:/s: and 1-256 bytes
          visibility text NOT NULL CHECK (visibility IN ('private', 'shared')),
          key        text NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 128),
          value      text NOT NULL CHECK (octet_length(value) <= 4000),
          author     text NOT NULL CHECK (octet_length(author) BETWEEN 3 AND 258),
          updated_at timestamptz NOT NULL DEFAULT now(),
          -- a shared row is the channel's (owner ''); a private row its owner's
          CHECK ((visibility = 'shared') = (owner = '')),
          PRIMARY KEY (channel, owner, key)
        )]],
      [[COMMENT ON TABLE sbx_notes IS 'pi-roundtable-sandbox notes: private to owner (principalId or speaker id) unless visibility = shared (owner empty)']],
    },
  },
}
