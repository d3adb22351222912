//go:build unix

package main

import (
	"context"
	"errors"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// fillStore is what fill needs of a store: the handler's insert path
// (Insert, then UpdateDelivery with the outcome), the history's minute
// records, and the reads it times after the fill (List of the parked
// results, the replay loop's Claim, ListPage).
type fillStore interface {
	Insert(ctx context.Context, rec *store.Record) (store.InsertResult, error)
	UpdateDelivery(ctx context.Context, key store.Key, fn func(*store.Delivery) error) (store.Delivery, error)
	WriteMinute(ctx context.Context, m store.HistoryMinute) error
	List(ctx context.Context, f store.Filter, limit int) ([]*store.Record, error)
	Claim(ctx context.Context, req store.ClaimRequest) ([]*store.Record, error)
	ListPage(ctx context.Context, q store.ListQuery) (store.Page, error)
	Close() error
}

// storeConfig names the store to fill: a Badger storage_dir (with its
// tables' layout: zero for the store's own), or with DSN set a PostgreSQL
// database and schema.
type storeConfig struct {
	dir    string
	tables badgerstore.TableOptions
	dsn    string
	schema string
}

// describe is the store's line in fill's output; never the DSN's
// password.
func (c storeConfig) describe() string {
	if c.dsn == "" {
		return "badger " + c.dir
	}
	loc, err := pgstore.Location(c.dsn)
	if err != nil {
		loc = "?"
	}
	return "postgres " + loc + " schema " + c.schema
}

// open opens the store as the plugin does (but for a measured table
// layout): badgerstore.Open on the directory, or pgstore.Open with the DSN
// and schema (the schema is created or migrated by the open; its other
// options are the plugin's defaults).
func (c storeConfig) open() (fillStore, error) {
	if c.dsn == "" {
		if c.dir == "" {
			return nil, errors.New("-dir or -postgres is required")
		}
		return badgerstore.Open(badgerstore.Options{Dir: c.dir, Tables: c.tables})
	}
	return pgstore.Open(pgstore.Options{DSN: c.dsn, Schema: c.schema})
}

// Interface guards
var (
	_ fillStore = (*badgerstore.Badger)(nil)
	_ fillStore = (*pgstore.Postgres)(nil)
)
