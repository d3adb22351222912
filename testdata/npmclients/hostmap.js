// Preloaded with `node --require ./hostmap.js` by npmclients_test.go: TLS
// connections to the API hosts named in PINGBACK_API_HOSTS (comma-separated)
// go to 127.0.0.1:PINGBACK_TLS_PORT, where the test's Caddy serves them. The
// host name stays the TLS server name (SNI) and the HTTP Host header, so
// Caddy routes by it and its certificate for that name is checked; the
// clients trust Caddy's local CA through NODE_EXTRA_CA_CERTS. The clients'
// own code is not touched: this stands in for an /etc/hosts entry and a
// port 443 listener, which a test cannot have without root.
'use strict';
const tls = require('tls');

const hosts = new Set((process.env.PINGBACK_API_HOSTS || '').split(',').filter(Boolean));
const port = Number(process.env.PINGBACK_TLS_PORT);
const connect = tls.connect;

tls.connect = function (...args) {
  const opts = args[0];
  if (opts && typeof opts === 'object' && hosts.has(opts.servername || opts.host)) {
    const name = opts.servername || opts.host;
    args[0] = Object.assign({}, opts, { host: '127.0.0.1', port, servername: name });
  }
  return connect.apply(this, args);
};
