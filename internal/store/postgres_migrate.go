package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The PostgreSQL schema lives in postgres_schema/NNNN_name.sql, applied in
// order; the version applied last is kept in schema_version. Several
// instances starting at once serialise on a session advisory lock, so each
// version is applied once.
//
//go:embed postgres_schema/*.sql
var pgSchemaFS embed.FS

// pgMigration is one versioned schema file.
type pgMigration struct {
	version int
	name    string
	sql     string
}

// pgMigrations returns the embedded migrations in version order.
func pgMigrations() ([]pgMigration, error) {
	files, err := fs.Glob(pgSchemaFS, "postgres_schema/*.sql")
	if err != nil {
		return nil, err
	}
	var out []pgMigration
	for _, f := range files {
		base := strings.TrimPrefix(f, "postgres_schema/")
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

// PostgresSchemaVersion is the schema version this build writes.
func PostgresSchemaVersion() int {
	ms, err := pgMigrations()
	if err != nil {
		return 0
	}
	return len(ms)
}

// pgAfter are the Go steps of migrations, run after the version's SQL in
// its transaction (search_path set to the store's schema), with
// PostgresOptions.LegacyAccounts.
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
		if err := checkAccount(&Task{Provider: prov, Account: acct}); err != nil {
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

// migrate creates the schema if needed and applies the migrations it
// lacks, under an advisory lock held on one connection for the whole run.
// A database at a newer version than this build knows is refused. legacy
// is PostgresOptions.LegacyAccounts (for migration 9). upTo, if positive,
// stops after that version (tests: a database of an earlier schema).
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string, legacy map[string]string, upTo int) error {
	ms, err := pgMigrations()
	if err != nil {
		return err
	}
	if upTo > 0 && upTo < len(ms) {
		ms = ms[:upTo]
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	lockKey := "caddy-pingback migrate " + schema
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", lockKey); err != nil {
		return fmt.Errorf("taking the migration lock: %w", err)
	}
	defer func() {
		// A session lock ends with the session too; unlock so the pooled
		// connection does not keep it.
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtextextended($1, 0))", lockKey)
	}()
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
		return fmt.Errorf("creating schema %s: %w", schema, err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+ident+".schema_version (version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
		return fmt.Errorf("creating schema_version: %w", err)
	}
	var have int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+ident+".schema_version").Scan(&have); err != nil {
		return fmt.Errorf("reading the schema version: %w", err)
	}
	if have > len(ms) {
		return fmt.Errorf("database schema %s is at version %d, newer than this plugin's %d: upgrade the plugin", schema, have, len(ms))
	}
	for _, m := range ms[have:] {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+ident); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			if after := pgAfter[m.version]; after != nil {
				if err := after(ctx, tx, legacy); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_version (version) VALUES ($1)", m.version)
			return err
		})
		if err != nil {
			return fmt.Errorf("applying schema %s: %w", m.name, err)
		}
	}
	return nil
}
