package testkit

import (
	"bytes"
	"mime/multipart"
	"testing"
)

// Multipart encodes fields (name, value pairs; an odd last name is left
// out) and, if file is not nil, a file part "file" named captcha.png, as
// multipart/form-data. It returns the Content-Type (with its boundary) and
// the body.
func Multipart(t testing.TB, file []byte, fields ...string) (contentType string, body []byte) {
	t.Helper()
	contentType, body, err := EncodeMultipart(file, fields...)
	if err != nil {
		t.Fatal(err)
	}
	return contentType, body
}

// EncodeMultipart is Multipart for code that returns its errors (a
// goroutine that must not call t.Fatal).
func EncodeMultipart(file []byte, fields ...string) (contentType string, body []byte, err error) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for i := 0; i+1 < len(fields); i += 2 {
		if err := mw.WriteField(fields[i], fields[i+1]); err != nil {
			return "", nil, err
		}
	}
	if file != nil {
		fw, err := mw.CreateFormFile("file", "captcha.png")
		if err != nil {
			return "", nil, err
		}
		if _, err := fw.Write(file); err != nil {
			return "", nil, err
		}
	}
	if err := mw.Close(); err != nil {
		return "", nil, err
	}
	return mw.FormDataContentType(), buf.Bytes(), nil
}
