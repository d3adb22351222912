package badgerstore

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
