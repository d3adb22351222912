package providerclient

import (
	"context"
	"net/http"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// TaskResult asks a provider's JSON API for one task's result
// (https://anti-captcha.com/apidoc/methods/getTaskResult,
// https://2captcha.com/api-docs/get-task-result). A TaskResult
// is safe for concurrent use if its HTTP client is.
type TaskResult struct {
	// Provider builds the request body (protocol.Provider's
	// GetTaskResultRequest: the task id as a number or a string, as the
	// provider issues them).
	Provider protocol.Provider
	// Endpoint is the API's base URL, without /getTaskResult and without
	// a trailing slash: https://api.anti-captcha.com, say. An Endpoint
	// that is no URL fails Get as http.NewRequest does.
	Endpoint string
	// Key is the account's API key, sent as clientKey.
	Key string
	// HTTP sends the requests; its Timeout bounds a call along with the
	// context.
	HTTP *http.Client
}

// Get POSTs getTaskResult {"clientKey":...,"taskId":...} as JSON and
// classifies the answer (protocol.ParseTaskResult). A transport error (the
// key redacted), a failed read, a non-200 status ("getTaskResult: HTTP
// 502") or a body that is not the protocol's JSON (wrapping
// protocol.ErrNotProtocol) is an error, each prefixed "getTaskResult: ".
func (c *TaskResult) Get(ctx context.Context, id string) (protocol.Answer, error) {
	req, err := newRequest(ctx, http.MethodPost, c.Endpoint+"/getTaskResult", c.Provider.GetTaskResultRequest(c.Key, id), "application/json")
	if err != nil {
		return protocol.Answer{}, err
	}
	req.Header.Set("Accept", "application/json")
	body, err := do(c.HTTP, req, c.Key, "getTaskResult")
	if err != nil {
		return protocol.Answer{}, err
	}
	return protocol.ParseTaskResult(body)
}
