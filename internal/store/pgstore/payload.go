package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
)

// ErasePayloads implements PayloadEraser: in one transaction, the
// delivered records not yet erased with updated_at at or before before
// are taken from the partial index records_payload_due, earliest first,
// locked (SKIP LOCKED: one another instance holds is left to it), and
// updated with their payload erased (store.ErasePayload; the request,
// JSON that SQL never parses, is rewritten here). An ordinary update:
// the old row versions are left to autovacuum.
func (p *Postgres) ErasePayloads(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 1 {
		return 0, errors.New("erase payloads: need a positive limit")
	}
	n := 0
	err := p.tx(ctx, func(tx pgx.Tx) error {
		n = 0
		rows, err := tx.Query(ctx, `SELECT provider, id, request FROM records
			WHERE state = 'delivered' AND NOT payload_erased AND updated_at <= $1
			ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED`, pgNano(before), limit)
		if err != nil {
			return err
		}
		var provs, ids []string
		var reqs [][]byte
		for rows.Next() {
			var prov, id string
			var raw []byte
			if err := rows.Scan(&prov, &id, &raw); err != nil {
				rows.Close()
				return err
			}
			rec := store.Record{Provider: prov, ID: id}
			if err := json.Unmarshal(raw, &rec.Request); err != nil {
				rows.Close()
				return fmt.Errorf("decoding stored request of %s:%s: %w", prov, id, err)
			}
			store.ErasePayload(&rec)
			req, err := json.Marshal(&rec.Request)
			if err != nil {
				rows.Close()
				return fmt.Errorf("encoding request: %w", err)
			}
			provs, ids, reqs = append(provs, prov), append(ids, id), append(reqs, req)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		tag, err := tx.Exec(ctx, `UPDATE records r SET code = ''::bytea, answer = NULL, other_code = NULL,
				request = u.request, payload_erased = true
			FROM unnest($1::text[], $2::text[], $3::bytea[]) AS u(provider, id, request)
			WHERE r.provider = u.provider AND r.id = u.id`, provs, ids, reqs)
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

var _ store.PayloadEraser = (*Postgres)(nil)
