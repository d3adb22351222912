package captchasim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
)

// Request size limits.
const (
	// maxRequestBytes bounds a whole in.php/res.php request body.
	maxRequestBytes = 2 << 20
	// maxImageBytes is the largest accepted captcha image, 600 kB
	// (source: docs/protocols.md §1.6, ERROR_TOO_BIG_CAPTCHA_FILESIZE).
	maxImageBytes = 600 << 10
)

// params holds the parameters of one in.php/res.php request, whatever its
// encoding.
type params struct {
	vals url.Values
	// file is the multipart "file" upload; hasFile reports whether the
	// field was present at all.
	file    []byte
	hasFile bool
}

// get returns the first value of key, or "".
func (p params) get(key string) string { return p.vals.Get(key) }

// errTooBig reports a request or upload over the size limits.
var errTooBig = errors.New("request too large")

// parseParams reads the request parameters from any of the encodings the
// legacy protocol accepts (source: docs/protocols.md §1.1, §1.2): the
// URL query (GET, and also merged under POST bodies), an
// application/x-www-form-urlencoded body, or a multipart/form-data body with
// an optional "file" upload. Other body types are ignored. Malformed bodies
// return an error together with whatever parameters were readable, so the
// caller can still honour json=1. It never panics on hostile input.
func parseParams(w http.ResponseWriter, r *http.Request) (params, error) {
	// PHP-like leniency: malformed pairs are skipped, the rest kept.
	query, _ := url.ParseQuery(r.URL.RawQuery)
	p := params{vals: query}
	if r.Method != http.MethodPost {
		return p, nil
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBytes)
	mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return p, nil // no usable body type: query only
	}
	switch mediaType {
	case "application/x-www-form-urlencoded":
		raw, err := io.ReadAll(r.Body)
		if err != nil {
			return p, sizeErr(err)
		}
		body, err := url.ParseQuery(string(raw))
		p.vals = merge(body, query)
		if err != nil {
			return p, fmt.Errorf("parsing form body: %w", err)
		}
		return p, nil
	case "multipart/form-data":
		return parseMultipart(r, p, query)
	}
	return p, nil
}

// parseMultipart reads a multipart/form-data body into p.
func parseMultipart(r *http.Request, p params, query url.Values) (params, error) {
	// Everything stays in memory: the body is already capped.
	if err := r.ParseMultipartForm(maxRequestBytes); err != nil {
		return p, sizeErr(err)
	}
	defer r.MultipartForm.RemoveAll()
	p.vals = merge(r.MultipartForm.Value, query)
	files := r.MultipartForm.File["file"]
	if len(files) == 0 {
		return p, nil
	}
	p.hasFile = true
	if files[0].Size > maxImageBytes {
		return p, errTooBig
	}
	f, err := files[0].Open()
	if err != nil {
		return p, fmt.Errorf("opening upload: %w", err)
	}
	defer f.Close()
	p.file, err = io.ReadAll(io.LimitReader(f, maxImageBytes+1))
	if err != nil {
		return p, fmt.Errorf("reading upload: %w", err)
	}
	if len(p.file) > maxImageBytes {
		return p, errTooBig
	}
	return p, nil
}

// sizeErr maps a body-size overflow to errTooBig and wraps anything else.
func sizeErr(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errTooBig
	}
	return fmt.Errorf("reading body: %w", err)
}

// merge returns body values with query values appended (body wins on Get).
func merge(body, query url.Values) url.Values {
	out := make(url.Values, len(body)+len(query))
	for k, v := range body {
		out[k] = append(out[k], v...)
	}
	for k, v := range query {
		out[k] = append(out[k], v...)
	}
	return out
}

// isDigits reports whether s is a non-empty string of ASCII digits, the only
// valid task id format (source: docs/protocols.md §1.6,
// ERROR_WRONG_ID_FORMAT).
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// reply is the json=1 envelope: {"status":1,"request":...} on success,
// {"status":0,"request":"ERROR_..."} on errors and CAPCHA_NOT_READY (source:
// docs/protocols.md §1.3, §1.4).
type reply struct {
	Status  int    `json:"status"`
	Request any    `json:"request"`
	Price   string `json:"price,omitempty"`
}

// writeOK answers a success. Plain answers are "OK|<request>" when okPrefix
// is set and the bare request otherwise (getbalance, bulk get).
func writeOK(w http.ResponseWriter, asJSON, okPrefix bool, request string) {
	if asJSON {
		writeJSON(w, reply{Status: 1, Request: request})
		return
	}
	if okPrefix {
		request = "OK|" + request
	}
	writePlain(w, request)
}

// writeCode answers an error code or CAPCHA_NOT_READY: the bare code in
// plain mode, {"status":0,"request":code} in JSON mode. The HTTP status is
// 200, as the providers send it.
func writeCode(w http.ResponseWriter, asJSON bool, code string) {
	if asJSON {
		writeJSON(w, reply{Status: 0, Request: code})
		return
	}
	writePlain(w, code)
}

// writePlain writes a text/plain 200 answer.
func writePlain(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, body)
}

// writeJSON writes v as an application/json 200 answer.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding reply", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// serverErrorStatuses are the statuses injected by ServerErrorRate.
var serverErrorStatuses = [...]int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable}

// writeServerError writes an nginx-style HTML error page with the given 5xx
// status, the "anything that doesn't look like the answer" case clients must
// retry (source: docs/protocols.md §1.6).
func writeServerError(w http.ResponseWriter, status int) {
	text := fmt.Sprintf("%d %s", status, http.StatusText(status))
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "<html>\r\n<head><title>%s</title></head>\r\n<body>\r\n<center><h1>%s</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n", text, text)
}
