package adminapi

// ReplayJobState is one bulk replay's progress: the answer of POST
// /pingback/replays and of GET and DELETE /pingback/replays/<id>.
type ReplayJobState struct {
	ID string `json:"id"`
	// Status is running, done or cancelled.
	Status string `json:"status"`
	// Matched results were found; Done of them were tried, Delivered
	// reached the app, Failed did not (still failed, rejected or parked
	// again, or refused: delivered in the meantime, or in flight).
	Matched   int `json:"matched"`
	Done      int `json:"done"`
	Delivered int `json:"delivered"`
	Failed    int `json:"failed"`
}
