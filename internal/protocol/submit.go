package protocol

import (
	"bytes"
	"mime"
	"net/url"
)

// AddPingback adds the in.php parameter pingback=<u>
// (https://2captcha.com/2captcha-api#pingback) to a submission that has
// none, every other byte unchanged: to the end of the query when there is
// no body, to the end of an urlencoded body, or as a new part before the
// closing boundary of a multipart body. A POST keeps a pingback URL with
// several query fields whole, which a GET submission does not (2captcha's
// warning), so the body is preferred whenever there is one. It returns the
// new query and body; ok is false for a body of another type or a
// multipart body without its closing boundary.
func AddPingback(rawQuery, contentType string, body []byte, u string) (query string, newBody []byte, ok bool) {
	if len(body) == 0 {
		if rawQuery != "" {
			rawQuery += "&"
		}
		return rawQuery + "pingback=" + url.QueryEscape(u), body, true
	}
	ct, params, _ := mime.ParseMediaType(contentType)
	switch ct {
	case "application/x-www-form-urlencoded":
		nb := bytes.TrimRight(bytes.Clone(body), "&")
		return rawQuery, append(nb, "&pingback="+url.QueryEscape(u)...), true
	case "multipart/form-data":
		b := params["boundary"]
		closing := []byte("--" + b + "--")
		i := bytes.LastIndex(body, closing)
		if b == "" || i < 0 {
			return rawQuery, nil, false
		}
		part := "--" + b + "\r\nContent-Disposition: form-data; name=\"pingback\"\r\n\r\n" + u + "\r\n"
		nb := make([]byte, 0, len(body)+len(part))
		nb = append(nb, body[:i]...)
		nb = append(nb, part...)
		return rawQuery, append(nb, body[i:]...), true
	}
	return rawQuery, nil, false
}
