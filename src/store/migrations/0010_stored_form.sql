-- Which stored form a message's or an event's `body` is in: the engine's own serde form
-- (`domain::STORED_FORM`), never a door's wire shape. Everything written so far is form 1.
-- A later form comes with a reader of the earlier ones, so a protocol's field can be renamed
-- without touching what is stored, and a change of the stored form needs no data migration.
ALTER TABLE messages ADD COLUMN form INTEGER NOT NULL DEFAULT 1;
ALTER TABLE events ADD COLUMN form INTEGER NOT NULL DEFAULT 1;
