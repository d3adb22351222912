package badgerstore

import "github.com/dgraph-io/badger/v4/options"

// TableOptions is a layout of Badger's tables other than the store's own,
// for measurement only (Options.Tables): what a day's store costs in
// files, disk, open time and memory with it. Zero fields are the store's
// own layout: tables of badgerTableSize (1 MiB) at every level,
// uncompressed, no block cache.
type TableOptions struct {
	// Size is the size in bytes of a table at Badger's base level
	// (BaseTableSize). 0: 1 MiB.
	Size int64
	// Multiplier is how many times larger a level's tables are than those
	// of the level above it, below the base level (TableSizeMultiplier;
	// Badger's default is 2). 0: 1, every level's tables of Size.
	Multiplier int
	// Compression is the codec of the table blocks Badger writes
	// (options.None, options.Snappy or options.ZSTD). The zero value is
	// options.None.
	Compression options.CompressionType
	// BlockCache is the size in bytes of Badger's cache of decompressed
	// blocks (BlockCacheSize). 0: none, which Open refuses with an error
	// when Compression is set (Badger itself would panic).
	BlockCache int64
}

// TablesInfo describes Badger's tables (bench/fill prints it): how many
// there are at each level, their bytes on disk, and of those the bytes of
// their indexes and bloom filters, which every open reads from each table
// (Badger's table.OpenTable reads a table's index, bloom filter included,
// and its last block), so an open reads about Index bytes, not the
// tables' size.
type TablesInfo struct {
	// Levels is the number of tables at each level, L0 first.
	Levels []int
	// OnDisk is the tables' size on disk, in bytes.
	OnDisk int64
	// Index is the size of their indexes, bloom filters included, in
	// bytes.
	Index int64
	// Bloom is the size of their bloom filters, in bytes.
	Bloom int64
}

// Tables describes the store's tables as they are now.
func (b *Badger) Tables() TablesInfo {
	var t TablesInfo
	for _, ti := range b.db.Tables() {
		for len(t.Levels) <= ti.Level {
			t.Levels = append(t.Levels, 0)
		}
		t.Levels[ti.Level]++
		t.OnDisk += int64(ti.OnDiskSize)
		t.Index += int64(ti.IndexSz)
		t.Bloom += int64(ti.BloomFilterSize)
	}
	return t
}
