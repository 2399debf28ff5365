package postgres

import "strings"

// queries are the statements of one schema.
type queries struct {
	insert, insertNew, insertAt, family, tombstoned                                   string
	lease, unlease, getMany, remove, release, incr, nextDue, reap, cancel, reschedule string
	purgeCancels, cancelSaga                                                          string
	batchRows, tombstone, delKeys, delScheds                                          string
	takeOver, anyDead, handBack                                                       string
	countLeased, countBoth, estimate, countLeasedBy                                   string
	listCols, table                                                                   string
}

// familySQL selects the rows of the message id in the parameter p: its
// sends' keys (wire.SendKey), the id and those after id||0x1F and before
// id||' ' (0x20), both ranges of the primary key.
func familySQL(p string) string {
	return `(id = ` + p + ` OR (id > (` + p + ` || E'\x1f') AND id < (` + p + ` || ' ')))`
}

// messageIDSQL is the message id of the row key in column col.
func messageIDSQL(col string) string { return `split_part(` + col + `, E'\x1f', 1)` }

// insertSQL stores rows with one statement; {{family}} is a further
// condition on each row and {{conflict}} the ON CONFLICT clause, if any
// (see insertNew, insert and insertAt in newQueries). Whether a row's
// destination is paused is a lookup in a hash of the paused table, built
// once per statement (a hashed subplan; the table holds a row per paused
// destination), not a probe of its index per row.
const insertSQL = `
INSERT INTO {{t}} (id, destination, exchange, due_at, received_at, message, attempts, last_error, not_before, saga_id, fingerprint, paused)
SELECT r.*, (r.exchange, r.destination) IN (SELECT p.exchange, p.destination FROM {{p}} p WHERE NOT p.resuming)
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::timestamptz[], $6::bytea[], $7::bigint[], $8::text[], $9::timestamptz[], $11::text[], $12::bytea[])
	AS r(id, destination, exchange, due_at, received_at, message, attempts, last_error, not_before, saga_id, fingerprint)
WHERE NOT EXISTS (SELECT 1 FROM {{c}} c WHERE c.id = r.id COLLATE "C" AND c.expires_at > $10){{family}}
ORDER BY id COLLATE "C"{{conflict}}
RETURNING id`

const onConflict = `
ON CONFLICT (id) DO NOTHING`

// newQueries names the schema qs in every statement.
func newQueries(qs string) queries {
	r := strings.NewReplacer("{{t}}", qs+".timeouts", "{{c}}", qs+".cancelled", "{{p}}", qs+".paused", "{{s}}", qs+".schedules", "{{seq}}", quoteLiteral(qs+".lock_seq"),
		"{{i}}", qs+".instances", "{{family $1}}", familySQL("$1"), "{{message id}}", messageIDSQL("id"))
	insert := func(family, conflict string) string {
		return r.Replace(strings.NewReplacer("{{family}}", family, "{{conflict}}", conflict).Replace(insertSQL))
	}
	return queries{
		insert:        insert(laterSendsFreeSQL, onConflict),
		insertNew:     insert(keysFreeSQL, ""),
		insertAt:      insert("", onConflict),
		takeOver:      r.Replace(takeOverSQL),
		anyDead:       r.Replace(anyDeadSQL),
		handBack:      r.Replace(handBackSQL),
		family:        r.Replace(sendsSQL),
		tombstoned:    r.Replace(tombstonedSQL),
		lease:         r.Replace(leaseSQL),
		unlease:       r.Replace(unleaseSQL),
		getMany:       r.Replace(getManySQL),
		remove:        r.Replace(removeSQL),
		release:       r.Replace(releaseSQL),
		incr:          r.Replace(incrSQL),
		nextDue:       r.Replace(nextDueSQL),
		reap:          r.Replace(reapSQL),
		cancel:        r.Replace(cancelSQL),
		cancelSaga:    r.Replace(cancelSagaSQL),
		purgeCancels:  r.Replace(purgeCancelsSQL),
		batchRows:     r.Replace(batchRowsSQL),
		tombstone:     r.Replace(tombstoneSQL),
		delKeys:       r.Replace(delKeysSQL),
		delScheds:     r.Replace(delSchedsSQL),
		reschedule:    r.Replace(rescheduleSQL),
		countLeased:   r.Replace(countLeasedSQL),
		countBoth:     r.Replace(countBothSQL),
		countLeasedBy: r.Replace(countLeasedBySQL),
		// The planner's row estimate (kept by autovacuum and ANALYZE):
		// -1 before the table was ever analyzed.
		estimate: `SELECT reltuples::bigint FROM pg_class WHERE oid = ` + quoteLiteral(qs+".timeouts") + `::regclass`,
		listCols: `id, destination, exchange, due_at, received_at, attempts, last_error, lock_token, lock_expires_at, not_before, coalesce(saga_id, ''), paused`,
		table:    r.Replace(`{{t}}`),
	}
}

// laterSendsFreeSQL is insert's {{family}} condition.
//
// Rows go in id order, so that concurrent batches sharing ids wait
// for each other in one order and never deadlock.
// $10 now: ids with a live cancel tombstone are not stored. A
// row of a paused destination is stored paused (the caller holds
// the cancel lock, which orders this against Pause and Resume).
// insert stores each row under its message id, and only when
// neither that key nor a later send's holds a row (the keys after
// id||0x1F): the common case, decided in this one statement. The
// rows it leaves are placed by Insert's second step (insertAt).
// The later sends are looked for with a scalar subquery, which
// the planner runs per row as one probe of the primary key: as
// NOT EXISTS it became an anti join, and a generic plan, which
// cannot know how narrow the range is, may scan the table for
// each statement instead (measured: PostgreSQL's CPU doubled at
// 2,000 msg/s and the bridge fell behind).
const laterSendsFreeSQL = `
	AND (SELECT f.id FROM {{t}} f WHERE f.id > (r.id || E'\x1f') COLLATE "C" AND f.id < (r.id || ' ') COLLATE "C" LIMIT 1) IS NULL`

// keysFreeSQL is insertNew's {{family}} condition.
//
// insertNew is insert for rows whose id no row holds a key of,
// without ON CONFLICT: one probe of the primary key per row, from
// the id to id||' ', covers the id and its later sends' keys
// alike, where insert's probe of the later sends was followed by
// ON CONFLICT's own probe of the id and a speculative insertion
// (a lock, and a second WAL record, per row). An id that some row
// holds, or merely one that others start with followed by a byte
// below ' ', is left for insertFirst's caller to place. Two
// instances storing one id at once: the second waits for the
// first's commit and fails (unique_violation), and insertFirst
// runs the batch again with insert.
const keysFreeSQL = `
	AND (SELECT f.id FROM {{t}} f WHERE f.id >= r.id COLLATE "C" AND f.id < (r.id || ' ') COLLATE "C" LIMIT 1) IS NULL`

// sendsSQL is the statement of queries.family:
// $1 message ids, $2 now: the pending sends of each id (its
// keys; see insert), their fingerprints and whether a live lease
// holds them. Two probes of the primary key per id (lateral, so
// that no plan scans the table).
const sendsSQL = `
SELECT q.id, f.id, f.fingerprint, coalesce(f.lock_token IS NOT NULL AND f.lock_expires_at > $2, false)
FROM unnest($1::text[]) AS q(id)
CROSS JOIN LATERAL (
	SELECT t.id, t.fingerprint, t.lock_token, t.lock_expires_at FROM {{t}} t WHERE t.id = q.id COLLATE "C"
	UNION ALL
	SELECT t.id, t.fingerprint, t.lock_token, t.lock_expires_at FROM {{t}} t
	WHERE t.id > (q.id || E'\x1f') COLLATE "C" AND t.id < (q.id || ' ') COLLATE "C"
) f`

// tombstonedSQL is the statement of queries.tombstoned:
// $1 message ids, $2 now: those with a live cancel tombstone.
const tombstonedSQL = `SELECT id FROM {{c}} WHERE id = ANY($1::text[]) AND expires_at > $2`

// leaseSQL is the statement of queries.lease:
// $1 dueBy, $2 now, $3 limit, $4 token prefix (owner:call.), $5 expiry.
// ready: unleased rows visible by dueBy, in due order (index
// timeouts_unpaused_ready; paused rows are not in it). expired: leased rows whose lease ran out by now
// (index timeouts_leased, oldest expiry first) and that are
// visible by dueBy too. Both lock their rows, skipping rows that
// another statement holds; the two are merged in due order and cut
// to limit. Rows locked but not picked are unlocked when the
// statement ends.
const leaseSQL = `
WITH ready AS (
	SELECT id, visible_at FROM {{t}}
	WHERE lock_token IS NULL AND NOT paused AND visible_at <= $1
	ORDER BY visible_at, id
	LIMIT $3
	FOR UPDATE SKIP LOCKED
), expired AS (
	SELECT id, visible_at FROM {{t}}
	WHERE lock_token IS NOT NULL AND lock_expires_at <= $2 AND visible_at <= $1 AND NOT paused
	ORDER BY lock_expires_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED
), picked AS (
	SELECT id FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) c
	ORDER BY visible_at, id
	LIMIT $3
), leased AS (
	UPDATE {{t}} t
	SET lock_token = $4::text || nextval({{seq}}), lock_expires_at = $5
	FROM picked
	WHERE t.id = picked.id
	RETURNING t.id, t.lock_token, t.due_at, t.visible_at
)
SELECT id, lock_token, due_at FROM leased ORDER BY visible_at, id`

// unleaseSQL is the statement of queries.unlease:
// $1 token prefix of one Lease call.
const unleaseSQL = `UPDATE {{t}} SET lock_token = NULL, lock_expires_at = NULL
WHERE lock_token IS NOT NULL AND starts_with(lock_token, $1)`

// getManySQL is the statement of queries.getMany:
// $1 ids, $2 the largest message to read: larger ones read as NULL.
// octet_length reads a stored value's size without reading the value.
const getManySQL = `
SELECT id, destination, exchange, due_at, received_at, CASE WHEN octet_length(message) <= $2 THEN message END, octet_length(message),
	attempts, last_error, lock_token, lock_expires_at, not_before, coalesce(saga_id, ''), paused, fingerprint
FROM {{t}} WHERE id = ANY($1::text[])`

// removeSQL is the statement of queries.remove:
// $1 ids, $2 locks, $3 now. cur: the rows named, locked in id order,
// as they are now. del: those that some ref may remove (no lock, or
// the current unexpired lock). The caller works out each ref's
// result from cur, in ref order.
const removeSQL = `
WITH refs AS (
	SELECT r.id COLLATE "C" AS id, r.lock FROM unnest($1::text[], $2::text[]) AS r(id, lock)
), cur AS (
	SELECT t.id, t.lock_token, t.lock_expires_at FROM {{t}} t
	WHERE t.id IN (SELECT id FROM refs)
	ORDER BY t.id
	FOR UPDATE
), del AS (
	DELETE FROM {{t}} t USING cur
	WHERE t.id = cur.id AND EXISTS (
		SELECT 1 FROM refs WHERE refs.id = cur.id
		AND (refs.lock = '' OR (refs.lock = cur.lock_token AND cur.lock_expires_at > $3)))
	RETURNING t.id
)
SELECT cur.id, coalesce(cur.lock_token, ''), cur.lock_expires_at, cur.id IN (SELECT id FROM del) FROM cur`

// releaseSQL is the statement of queries.release:
// $1 id, $2 lock (” = unconditional), $3 now, $4 notBefore.
const releaseSQL = `
WITH cur AS (
	SELECT id, coalesce(lock_token = $2::text AND lock_expires_at > $3, false) AS holds
	FROM {{t}} WHERE id = $1 FOR UPDATE
), upd AS (
	UPDATE {{t}} t SET lock_token = NULL, lock_expires_at = NULL, not_before = $4
	FROM cur WHERE t.id = cur.id AND ($2::text = '' OR cur.holds)
	RETURNING t.id
)
SELECT holds FROM cur`

// incrSQL is the statement of queries.incr:
// $1 id, $2 lock, $3 now, $4 reason.
const incrSQL = `
WITH cur AS (
	SELECT id, coalesce(lock_token = $2::text AND lock_expires_at > $3, false) AS holds
	FROM {{t}} WHERE id = $1 FOR UPDATE
), upd AS (
	UPDATE {{t}} t SET attempts = t.attempts + 1, last_error = $4
	FROM cur WHERE t.id = cur.id AND ($2::text = '' OR cur.holds)
	RETURNING t.attempts
)
SELECT cur.holds, (SELECT attempts FROM upd) FROM cur`

// nextDueSQL is the statement of queries.nextDue:
// The head of each partial index; least ignores NULL. A paused
// row's lease expiry is no time to wake at: Lease would not take
// it.
const nextDueSQL = `
SELECT least(
	(SELECT visible_at FROM {{t}} WHERE lock_token IS NULL AND NOT paused ORDER BY visible_at LIMIT 1),
	(SELECT lock_expires_at FROM {{t}} WHERE lock_token IS NOT NULL AND NOT paused ORDER BY lock_expires_at LIMIT 1))`

// reapSQL is the statement of queries.reap:
// $1 now. Rows another statement holds are left for the next Reap.
const reapSQL = `
WITH expired AS (
	SELECT id FROM {{t}} WHERE lock_token IS NOT NULL AND lock_expires_at <= $1
	FOR UPDATE SKIP LOCKED
)
UPDATE {{t}} t SET lock_token = NULL, lock_expires_at = NULL
FROM expired WHERE t.id = expired.id`

// cancelSQL is the statement of queries.cancel:
// $1 message id, $2 now, $3 tombstone expiry, $4 whether to
// leave one when nothing is pending (storage.CancelOrdered). The
// id's sends (see family), locked in key order; those under no
// live lease are deleted. The tombstone is left unless every send
// found is leased, or none was found and $4 is false; a repeated
// cancel extends the window. Answers how many were found and
// deleted.
const cancelSQL = `
WITH cur AS (
	SELECT id, coalesce(lock_token IS NOT NULL AND lock_expires_at > $2, false) AS busy
	FROM {{t}} WHERE {{family $1}} ORDER BY id FOR UPDATE
), del AS (
	DELETE FROM {{t}} t USING cur WHERE t.id = cur.id AND NOT cur.busy
	RETURNING t.id
), tomb AS (
	INSERT INTO {{c}} AS c (id, expires_at) SELECT $1, $3
	WHERE EXISTS (SELECT 1 FROM del) OR (NOT EXISTS (SELECT 1 FROM cur) AND $4)
	ON CONFLICT (id) DO UPDATE SET expires_at = greatest(c.expires_at, EXCLUDED.expires_at)
)
SELECT (SELECT count(*) FROM cur), (SELECT count(*) FROM del)`

// cancelSagaSQL is the statement of queries.cancelSaga:
// $1 saga ids, $2 now, $3 tombstone expiry, $4 message ids
// spared. The sagas' rows, locked in id order (index
// timeouts_saga_due); those not spared nor under a live lease are
// deleted and leave tombstones for their message ids, as Cancel's
// do.
const cancelSagaSQL = `
WITH cur AS (
	SELECT id, coalesce(lock_token IS NOT NULL AND lock_expires_at > $2, false) AS busy
	FROM {{t}} WHERE saga_id = ANY($1::text[]) AND {{message id}} <> ALL($4::text[])
	ORDER BY id
	FOR UPDATE
), del AS (
	DELETE FROM {{t}} t USING cur WHERE t.id = cur.id AND NOT cur.busy
	RETURNING t.id
), tomb AS (
	INSERT INTO {{c}} AS c (id, expires_at) SELECT DISTINCT {{message id}}, $3::timestamptz FROM del ORDER BY 1
	ON CONFLICT (id) DO UPDATE SET expires_at = greatest(c.expires_at, EXCLUDED.expires_at)
)
SELECT (SELECT count(*) FROM del), (SELECT count(*) FROM cur WHERE busy)`

// batchRowsSQL is the statement of queries.batchRows, InsertAndCancel's
// read: $1 message ids, $2 saga ids (schedule keys), $3 now. Every send of
// the ids (two probes of the primary key each, as family) and every row of
// the sagas (index timeouts_saga_due), locked in id order, each with its
// saga id, fingerprint and whether a live lease holds it.
const batchRowsSQL = `
SELECT t.id, coalesce(t.saga_id, ''), t.fingerprint, coalesce(t.lock_token IS NOT NULL AND t.lock_expires_at > $3, false)
FROM {{t}} t
WHERE t.id IN (
	SELECT f.id FROM unnest($1::text[]) AS q(id)
	CROSS JOIN LATERAL (
		SELECT x.id FROM {{t}} x WHERE x.id = q.id COLLATE "C"
		UNION ALL
		SELECT x.id FROM {{t}} x WHERE x.id > (q.id || E'\x1f') COLLATE "C" AND x.id < (q.id || ' ') COLLATE "C"
	) f
	UNION ALL
	SELECT x.id FROM {{t}} x WHERE x.saga_id = ANY($2::text[])
)
ORDER BY t.id
FOR UPDATE`

// tombstoneSQL is the statement of queries.tombstone: $1 message ids
// (distinct, in order), $2 expiry. A live tombstone keeps the later
// expiry, as Cancel's.
const tombstoneSQL = `
INSERT INTO {{c}} AS c (id, expires_at) SELECT u.id, $2::timestamptz FROM unnest($1::text[]) AS u(id) ORDER BY 1
ON CONFLICT (id) DO UPDATE SET expires_at = greatest(c.expires_at, EXCLUDED.expires_at)`

// delKeysSQL is the statement of queries.delKeys: $1 keys of rows
// the caller holds locked.
const delKeysSQL = `DELETE FROM {{t}} WHERE id = ANY($1::text[])`

// delSchedsSQL is the statement of queries.delScheds: $1
// schedule keys; answers those it deleted.
const delSchedsSQL = `DELETE FROM {{s}} WHERE key = ANY($1::text[]) RETURNING key`

// purgeCancelsSQL is the statement of queries.purgeCancels:
// $1 now.
const purgeCancelsSQL = `DELETE FROM {{c}} WHERE expires_at <= $1`

// rescheduleSQL is the statement of queries.reschedule:
// $1 message id, $2 now, $3 dueAt: every send of the id (see
// family) under no live lease. An expired lease ends here.
// Answers how many were found and moved.
const rescheduleSQL = `
WITH cur AS (
	SELECT id, coalesce(lock_token IS NOT NULL AND lock_expires_at > $2, false) AS busy
	FROM {{t}} WHERE {{family $1}} ORDER BY id FOR UPDATE
), upd AS (
	UPDATE {{t}} t SET due_at = $3, not_before = NULL, lock_token = NULL, lock_expires_at = NULL
	FROM cur WHERE t.id = cur.id AND NOT cur.busy
	RETURNING t.id
)
SELECT (SELECT count(*) FROM cur), (SELECT count(*) FROM upd)`

// countLeasedSQL is the statement of queries.countLeased.
const countLeasedSQL = `SELECT count(*) FROM {{t}} WHERE lock_token IS NOT NULL`

// countBothSQL is the statement of queries.countBoth.
const countBothSQL = `SELECT (SELECT count(*) FROM {{t}} WHERE lock_token IS NOT NULL), (SELECT count(*) FROM {{t}})`

// countLeasedBySQL is the statement of queries.countLeasedBy:
// The owner's own leases: the poller's backpressure. starts_with,
// not LIKE: a host name may hold LIKE's wildcards.
// $1 owner prefix, $2 most worth counting. ORDER BY the partial
// index's key with a LIMIT keeps the planner on timeouts_leased:
// with statistics taken while many rows were leased it otherwise
// chose a scan of the whole table, ten times a second per instance.
const countLeasedBySQL = `SELECT count(*) FROM (
	SELECT 1 FROM {{t}} WHERE lock_token IS NOT NULL AND starts_with(lock_token, $1)
	ORDER BY lock_expires_at LIMIT $2) mine`
