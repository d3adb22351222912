// Package protocol holds what the plugin knows of the captcha-solving
// providers' wire protocols, and nothing of Caddy: per provider the task id
// format, the callback (pingback) forms it sends, the submit and result
// requests and answers of both API families (legacy in.php/res.php and JSON
// createTask/getTaskResult), the classification of their answers (result,
// not ready, task-final error, unknown task, back off, key error) and the
// encoders that rebuild a provider's own callback from a polled answer.
//
// Every fact is sourced in docs/protocols.md of this repository, which
// links the providers' public documentation; the doc comments here name the
// page they rest on.
package protocol

import (
	"slices"
	"strings"
	"time"
)

// API is an API family a provider speaks.
type API string

// The API families.
const (
	// Legacy is in.php / res.php: submit with in.php, ask res.php?action=get,
	// pingbacks carry id and code (https://2captcha.com/2captcha-api).
	Legacy API = "legacy"
	// JSON is createTask / getTaskResult: JSON POST bodies with clientKey,
	// results as {"errorId":0,"status":"ready","solution":{...}}
	// (https://anti-captcha.com/apidoc/methods/createTask,
	// https://2captcha.com/api-docs/create-task).
	JSON API = "json"
)

// CallbackFormat is the form a result is delivered in to a callback URL.
type CallbackFormat string

// The callback formats.
const (
	// FormGET: GET with the query fields id and code appended to the URL's
	// own query (CaptchaAI, per its blog).
	FormGET CallbackFormat = "get"
	// FormPOST: POST application/x-www-form-urlencoded id=<id>&code=<code>
	// (2captcha, rucaptcha: https://2captcha.com/2captcha-api#pingback).
	FormPOST CallbackFormat = "form"
	// JSONPOST: POST application/json whose content is the getTaskResult
	// answer with the task id (anti-captcha family:
	// https://docs.capmonster.cloud/docs/api/methods/create-task).
	JSONPOST CallbackFormat = "json"
)

// Provider is what the plugin knows of one solving service. All durations
// are the provider's documented figures; zero means none is documented.
type Provider struct {
	// Name is the provider's name in the Caddyfile and JSON config.
	Name string
	// LegacyEndpoint is the default base URL of in.php and res.php; empty
	// when the provider has no legacy API the plugin speaks.
	LegacyEndpoint string
	// JSONEndpoint is the default base URL of createTask and
	// getTaskResult; empty when the provider has no JSON API.
	JSONEndpoint string
	// LegacyCallback is how the provider calls a legacy pingback URL:
	// FormGET or FormPOST.
	LegacyCallback CallbackFormat
	// JSONCallback is the default format of polled deliveries of tasks
	// submitted with createTask.
	JSONCallback CallbackFormat
	// NumericTaskID: the JSON API carries taskId as a JSON number (in
	// createTask answers, getTaskResult requests and callbacks); otherwise
	// as a string.
	NumericTaskID bool
	// UUIDTaskID: task ids are UUID-style strings rather than digits.
	UUIDTaskID bool
	// AckTimeout is the default time the pingback handler takes at most to
	// answer this provider's callbacks: half the anti-captcha family's 2 s.
	AckTimeout time.Duration
	// Retention is how long the provider keeps a result retrievable; after
	// it a poll can only answer "unknown task". Zero: undocumented.
	Retention time.Duration
	// MinResultGap is the least time between two getTaskResult (or
	// res.php) calls for one task that the provider asks for.
	MinResultGap time.Duration
	// MaxResultCalls is the most result calls for one task before the
	// provider bans the account; zero: no documented limit.
	MaxResultCalls int
	// ResultPOST: res.php takes its parameters as a POST form body (the
	// 2captcha API v1 documentation shows res.php requests as POST
	// bodies, https://2captcha.com/2captcha-api), so the poller's API key
	// stays out of URLs. False where only GET is documented.
	ResultPOST bool
}

// Has reports whether the provider speaks the API family.
func (p Provider) Has(api API) bool {
	switch api {
	case Legacy:
		return p.LegacyEndpoint != ""
	case JSON:
		return p.JSONEndpoint != ""
	}
	return false
}

// APIs lists the families the provider speaks.
func (p Provider) APIs() []API {
	var out []API
	for _, a := range []API{Legacy, JSON} {
		if p.Has(a) {
			out = append(out, a)
		}
	}
	return out
}

// Documented figures shared by several providers.
const (
	// legacyRetention: results of in.php tasks are retrievable for about
	// 15 minutes (rucaptcha's text for ERROR_WRONG_CAPTCHA_ID; 2captcha's
	// report window, https://2captcha.com/2captcha-api#res_errors).
	legacyRetention = 15 * time.Minute
	// minGapDocumented: "wait at least 5 seconds" between getTaskResult calls
	// (https://2captcha.com/api-docs/get-task-result,
	// https://anti-captcha.com/apidoc/methods/getTaskResult).
	minGapDocumented = 5 * time.Second
	ackDefault       = 2 * time.Second
	// ackAntiCaptcha: the anti-captcha family closes a callback's
	// connection after 2 s (https://docs.capmonster.cloud/docs/api/methods/create-task).
	ackAntiCaptcha = time.Second
)

// providers are the services the plugin knows. Sources in docs/protocols.md.
var providers = map[string]Provider{
	"captchaai": {
		Name:           "captchaai",
		LegacyEndpoint: "https://ocr.captchaai.com",
		LegacyCallback: FormGET,
		AckTimeout:     ackDefault,
		Retention:      legacyRetention, // assumed: CaptchaAI clones 2captcha's protocol
		MinResultGap:   minGapDocumented,
	},
	"2captcha":  twoCaptchaAPI("2captcha", "https://2captcha.com", "https://api.2captcha.com"),
	"rucaptcha": twoCaptchaAPI("rucaptcha", "https://rucaptcha.com", "https://api.rucaptcha.com"),
	"anticaptcha": {
		Name:          "anticaptcha",
		JSONEndpoint:  "https://api.anti-captcha.com",
		JSONCallback:  JSONPOST,
		NumericTaskID: true,
		AckTimeout:    ackAntiCaptcha,
		MinResultGap:  minGapDocumented,
	},
	"capmonster": {
		Name:          "capmonster",
		JSONEndpoint:  "https://api.capmonster.cloud",
		JSONCallback:  JSONPOST,
		NumericTaskID: true,
		AckTimeout:    ackAntiCaptcha,
		// ERROR_NO_SUCH_CAPCHA_ID: results can be fetched for 5 minutes;
		// ERROR_TOO_MUCH_REQUESTS: at most one call per 2 s
		// (https://zennolab.atlassian.net/wiki/spaces/APIS/pages/295396/Error+Types);
		// more than 120 getTaskResult calls per task ban the account for
		// 10 minutes (https://docs.capmonster.cloud/docs/api/block-reason/).
		Retention:      5 * time.Minute,
		MinResultGap:   2 * time.Second,
		MaxResultCalls: 120,
	},
	"capsolver": {
		Name:         "capsolver",
		JSONEndpoint: "https://api.capsolver.com",
		JSONCallback: JSONPOST,
		UUIDTaskID:   true,
		AckTimeout:   ackDefault,
	},
}

// twoCaptchaAPI is a provider that speaks 2captcha's API in both families
// (2captcha itself, rucaptcha), at its own legacy (in.php, res.php) and
// JSON endpoints.
func twoCaptchaAPI(name, legacyEndpoint, jsonEndpoint string) Provider {
	return Provider{
		Name:           name,
		LegacyEndpoint: legacyEndpoint,
		JSONEndpoint:   jsonEndpoint,
		LegacyCallback: FormPOST,
		JSONCallback:   FormPOST,
		NumericTaskID:  true,
		AckTimeout:     ackDefault,
		Retention:      legacyRetention,
		MinResultGap:   minGapDocumented,
		ResultPOST:     true,
	}
}

// Lookup returns the named provider.
func Lookup(name string) (Provider, bool) {
	p, ok := providers[name]
	return p, ok
}

// Names lists the known providers' names, sorted.
func Names() []string {
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// NameList is Names joined with ", ", for messages.
func NameList() string { return strings.Join(Names(), ", ") }
