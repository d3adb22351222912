package pgstore

import (
	"context"
	"errors"
	"slices"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
)

// Purge implements Purger on PostgreSQL: per batch of purgeChunk keys, one
// transaction takes the keys' advisory locks (those Insert and AddTask
// take, so an insert of the key waits and then sees the tombstone),
// deletes the records (and, for a filter, only those still in its
// state), writes their tombstones to purged and deletes their tasks.
//
// The rows are gone from every query at once. Their bytes stay in the
// table's files as dead tuples until VACUUM (autovacuum, or by hand) makes
// the space reusable, and until later writes overwrite it; WAL segments
// keep them until they are recycled. VACUUM FULL records rewrites the table
// without them (under an exclusive lock).
func (p *Postgres) Purge(ctx context.Context, q store.PurgeQuery) (int, error) {
	return store.PurgeBy(ctx, p, q, func(keys []store.Key, state store.State) (int, error) { return p.purgeKeys(ctx, keys, state) })
}

// purgeKeys purges the records under keys (only those in state, if set)
// in one transaction and returns how many it purged.
func (p *Postgres) purgeKeys(ctx context.Context, keys []store.Key, state store.State) (int, error) {
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, store.CompareKeys)
	provs, ids := make([]string, len(sorted)), make([]string, len(sorted))
	for i, k := range sorted {
		provs[i], ids[i] = k.Provider, k.ID
	}
	n := 0
	err := p.tx(ctx, func(tx pgx.Tx) error {
		n = 0
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(hashtext(p), hashtext(i)))
			FROM (SELECT p, i FROM unnest($1::text[], $2::text[]) AS k(p, i) ORDER BY p, i) s`, provs, ids); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `WITH gone AS (
				DELETE FROM records WHERE (provider, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
					AND ($3 = '' OR state = $3)
				RETURNING provider, id, expires_at),
			tasks_gone AS (
				DELETE FROM tasks t USING gone WHERE t.provider = gone.provider AND t.id = gone.id)
			INSERT INTO purged (provider, id, expires_at) SELECT provider, id, expires_at FROM gone
			ON CONFLICT (provider, id) DO UPDATE SET expires_at = greatest(purged.expires_at, excluded.expires_at)`,
			provs, ids, string(state))
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// purgedExisting is the InsertResult of an insert whose key was purged,
// if it was; ErrNotFound otherwise.
func (p *Postgres) purgedExisting(ctx context.Context, rec *store.Record) (store.InsertResult, error) {
	if err := p.isPurged(ctx, rec.Key()); !errors.Is(err, store.ErrPurged) {
		return store.InsertResult{}, err
	}
	return store.InsertResult{Existing: &store.Record{Provider: rec.Provider, ID: rec.ID, Code: rec.Code}, Purged: true}, nil
}

// isPurged returns ErrPurged if key has a tombstone, else ErrNotFound (or
// the query's error).
func (p *Postgres) isPurged(ctx context.Context, key store.Key) error {
	var one int
	err := p.pool.QueryRow(ctx, `SELECT 1 FROM purged WHERE provider = $1 AND id = $2`, key.Provider, key.ID).Scan(&one)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.ErrNotFound
	case err != nil:
		return err
	}
	return store.ErrPurged
}

// Interface guards
var _ store.Purger = (*Postgres)(nil)
