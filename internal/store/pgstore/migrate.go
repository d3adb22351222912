package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
)

// The PostgreSQL schema lives in schema/NNNN_name.sql, applied in
// order; the version applied last is kept in schema_version. Several
// instances starting at once serialise on a transaction-level advisory
// lock, so each version is applied once.
//
//go:embed schema/*.sql
var pgSchemaFS embed.FS

// pgMigration is one versioned schema file.
type pgMigration struct {
	version int
	name    string
	sql     string
}

// pgMigrations returns the embedded migrations in version order.
func pgMigrations() ([]pgMigration, error) {
	files, err := fs.Glob(pgSchemaFS, "schema/*.sql")
	if err != nil {
		return nil, err
	}
	var out []pgMigration
	for _, f := range files {
		base := strings.TrimPrefix(f, "schema/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("schema file %s: want NNNN_name.sql", base)
		}
		b, err := pgSchemaFS.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, pgMigration{version: v, name: base, sql: string(b)})
	}
	slices.SortFunc(out, func(a, b pgMigration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("schema file %s: versions must run 1, 2, ... without gaps", m.name)
		}
	}
	return out, nil
}

// SchemaVersion is the schema version this build writes.
func SchemaVersion() int {
	ms, err := pgMigrations()
	if err != nil {
		return 0
	}
	return len(ms)
}

// pgAfter are the Go steps of migrations, run after the version's SQL in
// its transaction (search_path set to the store's schema), with
// Options.LegacyAccounts.
var pgAfter = map[int]func(ctx context.Context, tx pgx.Tx, legacy map[string]string) error{
	9: stampLegacyAccounts,
}

// stampLegacyAccounts gives every task without account (all of them, as
// 0009 added the column) of a provider legacy names that account, and
// moves the provider's poll budget row (account "") to it too: the tasks
// it counted were submitted with the same key. The count triggers move
// the task counts.
func stampLegacyAccounts(ctx context.Context, tx pgx.Tx, legacy map[string]string) error {
	providers := slices.Sorted(maps.Keys(legacy))
	for _, prov := range providers {
		acct := legacy[prov]
		if acct == "" {
			continue
		}
		if err := store.CheckAccount(&store.Task{Provider: prov, Account: acct}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE tasks SET account = $2 WHERE provider = $1 AND account = ''`, prov, acct); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE providers SET account = $2 WHERE provider = $1 AND account = ''`, prov, acct); err != nil {
			return err
		}
	}
	return nil
}

// migrate creates the schema if it does not exist and applies the
// migrations it lacks, all in one write transaction under a
// transaction-scoped advisory lock (a session lock would outlive the
// transaction on a pooled server connection, and its unlock could run on
// another). The schema is created only when missing, so a role that owns
// an existing schema and has no CREATE right on the database starts. A
// database at a newer version than this build knows is refused. legacy is
// Options.LegacyAccounts (for migration 9). upTo, if positive,
// stops after that version (tests: a database of an earlier schema).
func migrate(ctx context.Context, db *pgDB, schema string, legacy map[string]string, upTo int) error {
	ms, err := pgMigrations()
	if err != nil {
		return err
	}
	if upTo > 0 && upTo < len(ms) {
		ms = ms[:upTo]
	}
	conn, err := db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left in a transaction is destroyed, not pooled
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { // nothing after a commit
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "caddy-pingback migrate "+schema); err != nil {
		return fmt.Errorf("taking the migration lock: %w", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		return fmt.Errorf("looking up schema %s: %w", schema, err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+db.path); err != nil {
			return fmt.Errorf("creating schema %s (it does not exist: create it for the store's role, or grant the role CREATE on the database; see docs/storage.md): %w", schema, err)
		}
	}
	if err := db.opened(tx.QueryRow(ctx, pgBeginWrite, db.path), nil); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
		return fmt.Errorf("creating schema_version: %w", err)
	}
	var have int
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_version").Scan(&have); err != nil {
		return fmt.Errorf("reading the schema version: %w", err)
	}
	if have > len(ms) {
		return fmt.Errorf("database schema %s is at version %d, newer than this plugin's %d: upgrade the plugin", schema, have, len(ms))
	}
	for _, m := range ms[have:] {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("applying schema %s: %w", m.name, err)
		}
		if after := pgAfter[m.version]; after != nil {
			if err := after(ctx, tx, legacy); err != nil {
				return fmt.Errorf("applying schema %s: %w", m.name, err)
			}
		}
		if _, err := tx.Exec(ctx, "INSERT INTO schema_version (version) VALUES ($1)", m.version); err != nil {
			return fmt.Errorf("applying schema %s: %w", m.name, err)
		}
	}
	return tx.Commit(ctx)
}
