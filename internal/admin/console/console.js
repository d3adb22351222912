// pingback console: plain JavaScript, no build step, no external assets.
//
// Every value shown comes from stored pingbacks, which anyone on the
// Internet can send: the page builds its DOM with createElement and text
// nodes only (never innerHTML), and links only to "?..." URLs it builds
// with URLSearchParams. All URLs are relative, so the console works at a
// site's root and under any handle_path.
'use strict';

(function () {
	const meta = (name) => document.querySelector('meta[name="' + name + '"]').content;
	const TOKEN = meta('pingback-console-token');
	const STATES = meta('pingback-states').split(' ').filter(Boolean);
	const PROVIDERS = meta('pingback-providers').split(' ').filter(Boolean);
	// serverNow is the server's clock (the page's load time as the server
	// wrote it, plus the time since): the charts' range and every "ago" are
	// measured by it, as the admin API's default range is, whatever the
	// browser's clock says.
	const SKEW = (() => {
		const t = Date.parse(meta('pingback-now'));
		return isNaN(t) ? 0 : t - Date.now();
	})();
	const serverNow = () => Date.now() + SKEW;
	const TASK_STATES = ['pending', 'done', 'expired'];
	const PAGE = 50;
	const main = document.getElementById('main');

	// generation is bumped at each render, so that timers and answers of a
	// view the operator left do nothing.
	let generation = 0;
	let purgeProbe = null; // a promise of whether purge exists, once probed

	// el builds an element: attrs are set as attributes (on* as listeners),
	// children are nodes or text.
	function el(tag, attrs, ...kids) {
		const e = document.createElement(tag);
		for (const [k, v] of Object.entries(attrs || {})) {
			if (v === null || v === undefined || v === false) continue;
			if (k === 'class') e.className = v;
			else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
			else e.setAttribute(k, v === true ? '' : String(v));
		}
		for (const k of kids.flat(Infinity)) {
			if (k === null || k === undefined || k === false) continue;
			e.append(k instanceof Node ? k : document.createTextNode(String(k)));
		}
		return e;
	}

	// href builds an in-page link from query parameters (empty ones left out).
	function href(params) {
		const q = new URLSearchParams();
		for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
		const s = q.toString();
		return s ? '?' + s : './';
	}

	function navLink(params, ...kids) {
		return el('a', {href: href(params), 'data-nav': true}, ...kids);
	}

	function go(params) {
		history.pushState(null, '', href(params));
		render();
	}

	// api calls the admin API through the console: api/<route> is the admin
	// route /pingback/<route>. It answers {status, ok, data}.
	async function api(method, route, body) {
		const opts = {method, headers: {'X-Pingback-Console-Token': TOKEN}, credentials: 'same-origin', cache: 'no-store'};
		if (body !== undefined) {
			opts.headers['Content-Type'] = 'application/json';
			opts.body = JSON.stringify(body);
		}
		let res;
		try {
			res = await fetch('api/' + route, opts);
		} catch (e) {
			return {status: 0, ok: false, data: {error: 'the console is unreachable: ' + e.message}};
		}
		const text = await res.text();
		let data = null;
		try {
			data = text ? JSON.parse(text) : null;
		} catch (e) {
			data = {error: text.trim() || res.statusText};
		}
		return {status: res.status, ok: res.ok, data};
	}

	const errorOf = (r) => (r.data && r.data.error) || ('HTTP ' + r.status);
	const keyPath = (provider, id) => encodeURIComponent(provider) + '/' + encodeURIComponent(id);

	function msg(text, kind) {
		return el('p', {class: 'msg ' + (kind || '')}, text);
	}

	// listOf accepts a bare array or an object holding the array under name
	// (with next_cursor), as the admin API answers lists.
	function listOf(data, name) {
		if (Array.isArray(data)) return {items: data, next: ''};
		if (data && Array.isArray(data[name])) return {items: data[name], next: data.next_cursor || ''};
		return {items: [], next: ''};
	}

	function isTime(t) {
		return typeof t === 'string' && t !== '' && !t.startsWith('0001-');
	}

	// toLocalInput turns an RFC 3339 time into a datetime-local input's
	// value (the browser's local time, to the second); fromLocalInput turns
	// one back into RFC 3339 (UTC). Either answers '' for what is no time.
	function toLocalInput(t) {
		const d = new Date(t || '');
		if (!t || isNaN(d)) return '';
		const pad = (n) => String(n).padStart(2, '0');
		return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + 'T' +
			pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
	}

	function fromLocalInput(v) {
		const d = new Date(v || '');
		return !v || isNaN(d) ? '' : d.toISOString().replace(/\.\d+Z$/, 'Z');
	}

	function ago(seconds) {
		const s = Math.round(Math.abs(seconds));
		let v;
		if (s < 90) v = s + 's';
		else if (s < 5400) v = Math.round(s / 60) + 'm';
		else if (s < 172800) v = Math.round(s / 3600) + 'h';
		else v = Math.round(s / 86400) + 'd';
		return seconds >= 0 ? v + ' ago' : 'in ' + v;
	}

	function when(t) {
		if (!isTime(t)) return el('span', {class: 'muted'}, '—');
		const d = new Date(t);
		if (isNaN(d)) return t;
		const iso = d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
		return el('time', {datetime: t, title: iso}, iso + ' (' + ago((serverNow() - d.getTime()) / 1000) + ')');
	}

	function duration(seconds) {
		if (typeof seconds !== 'number') return '—';
		if (seconds === 0) return '0s';
		return ago(seconds).replace(' ago', '');
	}

	function stateBadge(state) {
		return el('span', {class: 'state state-' + String(state).replace(/[^a-z]/g, '')}, state || '?');
	}

	function kv(pairs) {
		const dl = el('dl', {class: 'kv'});
		for (const [k, v] of pairs) {
			if (v === undefined || v === null || v === '') continue;
			dl.append(el('dt', null, k), el('dd', null, v));
		}
		return dl;
	}

	// text decodes a []byte field (base64 in JSON) as UTF-8 text.
	function bytesText(b64) {
		if (!b64) return '';
		try {
			const bin = atob(b64);
			const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
			return new TextDecoder('utf-8', {fatal: false}).decode(bytes);
		} catch (e) {
			return b64;
		}
	}

	// confirmBox asks before an action that cannot be undone or touches
	// many results; it replaces itself with the action's outcome.
	function confirmBox(question, label, action) {
		const box = el('div', {class: 'confirm', role: 'alertdialog'}, el('p', {class: 'msg'}, question));
		const yes = el('button', {class: 'danger', 'data-confirm': 'yes'}, label);
		const no = el('button', {'data-confirm': 'no'}, 'Cancel');
		yes.addEventListener('click', () => {
			yes.disabled = no.disabled = true;
			action(box);
		});
		no.addEventListener('click', () => box.remove());
		box.append(el('div', {class: 'actions'}, yes, no));
		return box;
	}

	// probePurge reports, once per page load, whether the admin API has
	// purge: POST /pingback/purges with no filter is refused with 400 where
	// it exists; 404 or 405 means this Caddy has no purge, and the page
	// shows no purge button.
	function probePurge() {
		if (purgeProbe === null) {
			purgeProbe = api('POST', 'purges', {}).then((r) => {
				const ok = r.status !== 404 && r.status !== 405 && r.status !== 0;
				document.body.dataset.purge = ok ? 'yes' : 'no';
				return ok;
			});
		}
		return purgeProbe;
	}

	// ---- overview ----

	// overview lays out the page once: the parts that come from
	// GET /pingback/status and /pingback/deadletters are replaced at each
	// refresh (every 5 s); the pause form and the charts are not, so that
	// what the operator types or picks stays.
	async function overview(gen) {
		const part = (id) => el('div', {id});
		const parts = {
			overall: part('overall'), providers: part('ov-providers'), pauses: part('pauses'), health: part('ov-health'),
			deadletters: part('deadletters'), notifications: part('ov-notifications'), rest: part('ov-rest'),
		};
		const pauseForm = pauseFormOf(gen);
		main.replaceChildren(el('h1', null, 'Overview'), parts.overall, parts.providers,
			el('h2', null, 'Pauses'), parts.pauses, pauseForm,
			parts.health,
			el('h2', null, 'Dead letters by error'), parts.deadletters,
			parts.notifications,
			historySectionOf(gen),
			parts.rest);
		await refreshOverview(gen, parts, pauseForm);
	}

	// DEAD_LETTERS_EVERY is how often the overview groups the dead letters
	// again (a scan of up to 10,000 records): less often than the status.
	const DEAD_LETTERS_EVERY = 30000;

	async function refreshOverview(gen, parts, pauseForm) {
		const stale = !parts.dl || Date.now() - parts.dlAt >= DEAD_LETTERS_EVERY;
		const [r, dl] = await Promise.all([api('GET', 'status'), stale ? api('GET', 'deadletters') : parts.dl]);
		if (gen !== generation) return;
		if (stale) {
			parts.dl = dl;
			parts.dlAt = Date.now();
		}
		if (!r.ok) {
			parts.overall.replaceChildren(overallBox('error', [msg(errorOf(r), 'error')]));
			setTimeout(() => { if (gen === generation) refreshOverview(gen, parts, pauseForm); }, 5000);
			return;
		}
		const s = r.data || {};
		const records = s.records || {};
		const tasks = s.tasks || {};
		const pauses = Array.isArray(s.pauses) ? s.pauses : null; // null: this Caddy cannot pause
		const pauseOf = (p) => (pauses || []).find((x) => x.provider === p) || (pauses || []).find((x) => x.provider === '*');
		const providers = [...new Set([...Object.keys(records), ...Object.keys(tasks), ...Object.keys(s.last_callback_at || {})])].sort();

		parts.overall.replaceChildren(overallState(s, pauses));

		const grid = el('div', {class: 'grid'});
		if (providers.length === 0) parts.providers.replaceChildren(msg('Nothing stored yet.', 'muted'));
		for (const p of providers) {
			const byState = records[p] || {};
			const counts = el('div', {class: 'counts'});
			const states = [...STATES, ...Object.keys(byState).filter((x) => !STATES.includes(x))];
			let total = 0;
			for (const st of states) {
				const n = byState[st] || 0;
				total += n;
				counts.append(navLink({view: 'records', provider: p, state: st},
					el('span', {class: n > 0 && st !== 'delivered' ? 'nonzero state-' + st : ''}, st + ' ' + n)));
			}
			const t = tasks[p] || {};
			const budget = (s.budget || {})[p];
			const unpollable = t.unpollable === undefined ? undefined :
				el('span', {class: t.unpollable > 0 ? 'nonzero state-expired' : ''}, String(t.unpollable));
			const oldestUndelivered = (s.oldest_undelivered_age_seconds || {})[p];
			const pause = pauseOf(p);
			grid.append(el('section', {class: 'card', 'data-provider': p},
				el('h3', null, navLink({view: 'records', provider: p}, p), ' ', el('span', {class: 'muted'}, total + ' stored')),
				counts,
				kv([
					['pending tasks', t.pending === undefined ? undefined : navLink({view: 'tasks', provider: p, state: 'pending'}, String(t.pending))],
					['unpollable', unpollable],
					['oldest pending', t.oldest_pending_age_seconds === undefined ? undefined : duration(t.oldest_pending_age_seconds)],
					['retry backlog', oldestUndelivered === undefined ? undefined : (oldestUndelivered > 0 ? duration(oldestUndelivered) + ' old' : 'none')],
					['last pingback', (s.last_callback_at || {})[p] === undefined ? undefined : when(s.last_callback_at[p])],
					['budget', budget ? 'used ' + budget.used + ', left ' + budget.left : undefined],
					['deliveries', pauses === null ? undefined : (pause ? pauseText(pause) : 'running')],
				]),
				pauses === null ? [] : el('div', {class: 'actions'}, pauseButton(gen, p, pause, pauseForm)),
				accountList(p, (s.accounts || {})[p])));
		}
		if (providers.length > 0) parts.providers.replaceChildren(grid);

		parts.pauses.replaceChildren(...pauseList(gen, pauses));
		pauseForm.hidden = pauses === null;
		setPauseProviders(pauseForm, providers);
		parts.health.replaceChildren(...routeHealth(gen, s.route_health, pauseOf, pauses !== null, pauseForm));
		parts.deadletters.replaceChildren(...deadLetterGroups(dl));
		parts.notifications.replaceChildren(...notificationList(s.notifications));

		const loops = s.loops || {};
		const loopPairs = Object.keys(loops).sort().map((l) => [l + ' loop', when(loops[l].last_run_at)]);
		const st = s.store || {};
		parts.rest.replaceChildren(...heldRoutes(s.routes), el('h2', null, 'Loops and store'), el('div', {class: 'card'}, kv([
			...loopPairs,
			['store', [st.kind, st.location].filter(Boolean).join(' ')],
			['available', st.available === undefined ? undefined : (st.available ? 'yes' : 'no')],
			['free space', typeof st.free_bytes === 'number' ? formatBytes(st.free_bytes) : undefined],
		])));
		setTimeout(() => { if (gen === generation) refreshOverview(gen, parts, pauseForm); }, 5000);
	}

	// overallState is the page's first answer: OK, or the list of what
	// needs a person (parked, rejected, quarantined and expired results,
	// the store unavailable, routes failing, pauses), each a link to it.
	function overallState(s, pauses) {
		const sum = {};
		for (const byState of Object.values(s.records || {})) {
			for (const [st, n] of Object.entries(byState || {})) sum[st] = (sum[st] || 0) + (n || 0);
		}
		const needs = [];
		const need = (kind, ...kids) => needs.push(el('li', {'data-need': kind}, ...kids));
		if ((s.store || {}).available === false) need('store', 'The store is unavailable: pingbacks are refused.');
		for (const [st, what] of [['parked', 'parked: replays gave up'], ['rejected', 'rejected by the app'],
			['quarantined', 'quarantined: not shown to be the provider\'s'], ['expired', 'expired: too old to deliver']]) {
			if (sum[st] > 0) need(st, navLink({view: 'records', state: st}, sum[st] + ' ' + (sum[st] === 1 ? 'result ' : 'results ') + what));
		}
		for (const name of Object.keys(s.route_health || {}).sort()) {
			const h = s.route_health[name] || {};
			if (isTime(h.failing_since)) need('route', 'Route ' + name + ' failing since ', when(h.failing_since));
		}
		for (const p of pauses || []) need('pause', 'Deliveries of ' + pauseName(p.provider) + ' ' + pauseText(p));
		if (needs.length === 0) return overallBox('ok', [el('strong', null, 'OK'), ' nothing needs a person.']);
		return overallBox('attention', [el('strong', null, 'Needs a person'), el('ul', null, needs)]);
	}

	function overallBox(state, kids) {
		return el('section', {class: 'overall overall-' + state, 'data-state': state, role: 'status'}, kids);
	}

	const pauseName = (p) => p === '*' ? 'every provider' : p;

	function pauseText(p) {
		const parts = ['paused ' + (isTime(p.since) ? 'since ' + shortTime(p.since) : '')];
		if (p.by) parts.push('by ' + p.by);
		if (p.reason) parts.push('(' + p.reason + ')');
		parts.push(isTime(p.until) ? 'until ' + shortTime(p.until) : 'until resumed');
		return parts.join(' ').replace(/\s+/g, ' ');
	}

	function shortTime(t) {
		const d = new Date(t);
		return isNaN(d) ? String(t) : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') + ' (' + ago((serverNow() - d.getTime()) / 1000) + ')';
	}

	// pauseButton is Resume for a paused provider (its own pause; a
	// provider held only by the pause of every provider resumes with that
	// one, in the Pauses list), else Pause…, which fills in the pause form.
	function pauseButton(gen, provider, pause, form) {
		if (pause && pause.provider === provider) return resumeButton(gen, pause);
		if (pause) return el('span', {class: 'muted'}, 'held by the pause of every provider');
		const b = el('button', {'data-action': 'pause', 'data-pause': provider}, 'Pause…');
		b.addEventListener('click', () => {
			form.elements.provider.value = provider;
			form.elements.reason.focus();
		});
		return b;
	}

	function resumeButton(gen, pause) {
		const b = el('button', {class: 'primary', 'data-action': 'resume', 'data-pause': pause.provider}, 'Resume ' + pauseName(pause.provider));
		b.addEventListener('click', async () => {
			b.disabled = true;
			const r = await api('DELETE', 'pauses/' + encodeURIComponent(pause.provider));
			if (gen !== generation) return;
			if (!r.ok && r.status !== 404) {
				b.disabled = false;
				b.after(msg(errorOf(r), 'error'));
				return;
			}
			render();
		});
		return b;
	}

	function pauseList(gen, pauses) {
		if (pauses === null) return [msg('This Caddy cannot pause deliveries.', 'muted')];
		if (pauses.length === 0) return [msg('No pause: deliveries run.', 'muted')];
		return pauses.map((p) => el('section', {class: 'card', 'data-paused': p.provider},
			el('h3', null, pauseName(p.provider)),
			kv([['since', when(p.since)], ['until', isTime(p.until) ? when(p.until) : 'resumed by hand'], ['by', p.by], ['reason', p.reason]]),
			el('div', {class: 'actions'}, resumeButton(gen, p))));
	}

	// pauseFormOf is the form that pauses a provider (or every one):
	// POST /pingback/pauses with by "console", a reason and an optional
	// time it resumes by itself (a local date and time, sent as RFC 3339).
	function pauseFormOf(gen) {
		const out = el('div', {class: 'msg'});
		const form = el('form', {class: 'filters', id: 'pause-form', hidden: true},
			el('label', null, 'provider', el('select', {name: 'provider'}, el('option', {value: '*'}, 'every provider'))),
			el('label', null, 'reason', el('input', {name: 'reason', placeholder: 'deploy', size: 16})),
			el('label', null, 'resume at (optional)', el('input', {name: 'until', type: 'datetime-local', step: 1})),
			el('button', {type: 'submit', class: 'danger'}, 'Pause deliveries'), out);
		form.addEventListener('submit', async (ev) => {
			ev.preventDefault();
			const body = {provider: form.elements.provider.value, by: 'console'};
			const reason = form.elements.reason.value.trim();
			if (reason) body.reason = reason;
			const until = fromLocalInput(form.elements.until.value);
			if (until) body.until = until;
			const r = await api('POST', 'pauses', body);
			if (gen !== generation) return;
			if (!r.ok) {
				out.replaceChildren(msg(errorOf(r), 'error'));
				return;
			}
			form.reset();
			render();
		});
		return form;
	}

	// setPauseProviders keeps the pause form's providers those the overview
	// shows, and the operator's choice.
	function setPauseProviders(form, providers) {
		const sel = form.elements.provider;
		const have = [...sel.options].map((o) => o.value).slice(1);
		if (have.join(' ') === providers.join(' ')) return;
		const chosen = sel.value;
		sel.replaceChildren(el('option', {value: '*'}, 'every provider'), ...providers.map((p) => el('option', {value: p}, p)));
		sel.value = [...sel.options].some((o) => o.value === chosen) ? chosen : '*';
	}

	// routeHealth shows each route's last successful delivery and since
	// when it fails (status' route_health), with its provider's pause: the
	// nodes to add, none when the status has no route health.
	function routeHealth(gen, health, pauseOf, canPause, form) {
		const names = Object.keys(health || {}).sort();
		if (names.length === 0) return [];
		const grid = el('div', {class: 'grid'});
		for (const name of names) {
			const h = health[name] || {};
			const pause = h.provider ? pauseOf(h.provider) : undefined;
			const failing = isTime(h.failing_since);
			grid.append(el('section', {class: 'card', 'data-route-health': name, 'data-failing': failing ? 'yes' : 'no'},
				el('h3', null, name),
				kv([
					['provider', h.provider],
					['last success', isTime(h.last_success) ? when(h.last_success) : 'none yet'],
					['failing since', failing ? el('span', {class: 'nonzero state-parked'}, when(h.failing_since)) : 'not failing'],
					['failures in a row', typeof h.failures === 'number' && h.failures > 0 ? String(h.failures) : undefined],
					['deliveries', !canPause ? undefined : (pause ? pauseText(pause) : 'running')],
				]),
				canPause && h.provider ? el('div', {class: 'actions'}, pauseButton(gen, h.provider, pause, form)) : []));
		}
		return [el('h2', null, 'Routes'), grid];
	}

	// deadLetterGroups shows GET /pingback/deadletters: the parked,
	// rejected and failed results grouped by route, provider, state and
	// error, with count and first and last seen.
	function deadLetterGroups(r) {
		if (!r.ok) {
			return [msg(r.status === 404 ? 'This Caddy does not group dead letters.' : errorOf(r), r.status === 404 ? 'muted' : 'error')];
		}
		const groups = (r.data && r.data.groups) || [];
		if (groups.length === 0) return [msg('No dead letter: nothing parked, rejected or failing.', 'muted')];
		const out = groups.map((g) => el('section', {class: 'card', 'data-group': [g.route, g.provider, g.state, g.error].join('|')},
			el('div', {class: 'rec-head'}, stateBadge(g.state), el('strong', {class: 'count'}, String(g.count)),
				navLink({view: 'records', provider: g.provider, state: g.state}, g.provider + ' → ' + g.route)),
			kv([['error', g.error || 'none recorded'], ['first seen', when(g.first_seen)], ['last seen', when(g.last_seen)]])));
		if (r.data.truncated) out.push(msg('Counted from the first ' + r.data.scanned + ' dead letters only.', 'muted'));
		return out;
	}

	// notificationList shows the notifications this Caddy sent lately
	// (status' notifications), newest first; none when the status has none.
	function notificationList(list) {
		if (!Array.isArray(list)) return [];
		const head = el('h2', null, 'Recent notifications');
		if (list.length === 0) return [head, msg('None sent.', 'muted')];
		return [head, el('div', {class: 'card', id: 'notifications'}, list.map((n) =>
			el('section', {class: 'note', 'data-event': n.event},
				el('strong', null, n.event), n.provider ? ' ' + n.provider : '', n.count > 1 ? ' ×' + n.count : '', ' ',
				el('span', {class: 'muted'}, isTime(n.last_at) ? shortTime(n.last_at) : ''))))];
	}

	// ---- history charts ----

	const RANGES = [['1 h', 3600], ['6 h', 6 * 3600], ['24 h', 86400], ['3 d', 3 * 86400], ['7 d', 7 * 86400]];

	// historySectionOf is the charts of GET /pingback/history over a range
	// the operator picks (1 h by default, up to the retention: the API
	// refuses more, and the page says why); "no history" where the admin
	// API has none.
	function historySectionOf(gen) {
		const charts = el('div', {id: 'charts'});
		const sel = el('select', {id: 'range', name: 'range'}, RANGES.map(([label, s]) => el('option', {value: String(s)}, label)));
		sel.addEventListener('change', () => loadHistory(gen, charts, Number(sel.value)));
		loadHistory(gen, charts, Number(sel.value));
		return el('section', {id: 'history-section'},
			el('h2', null, 'History'),
			el('form', {class: 'filters'}, el('label', null, 'range', sel)),
			charts);
	}

	async function loadHistory(gen, charts, seconds) {
		const to = new Date(serverNow());
		const from = new Date(to.getTime() - seconds * 1000);
		const q = new URLSearchParams({from: rfc3339(from), to: rfc3339(to)});
		const r = await api('GET', 'history?' + q);
		if (gen !== generation) return;
		if (r.status === 404) {
			charts.dataset.history = 'none';
			charts.replaceChildren(msg('No history: this Caddy keeps none.', 'muted'));
			return;
		}
		if (!r.ok) {
			charts.dataset.history = 'error';
			charts.replaceChildren(msg(errorOf(r), 'error'));
			return;
		}
		drawCharts(charts, (r.data && r.data.points) || []);
		charts.dataset.history = 'shown';
		clearTimeout(charts.timer);
		charts.timer = setTimeout(() => { if (gen === generation && charts.isConnected) loadHistory(gen, charts, seconds); }, 60000);
	}

	const rfc3339 = (d) => d.toISOString().replace(/\.\d+Z$/, 'Z');

	// drawCharts draws the history's points with uPlot: received per
	// minute by result, deliveries by outcome, the backlog by state, the
	// delivery delay p50 and p95.
	function drawCharts(charts, points) {
		for (const c of charts.querySelectorAll('[data-chart]')) if (c.plot) c.plot.destroy();
		charts.replaceChildren();
		if (typeof uPlot !== 'function') {
			charts.append(msg('The charting library did not load.', 'error'));
			return;
		}
		const xs = points.map((p) => Math.floor(new Date(p.minute).getTime() / 1000));
		const byKey = (field) => {
			const keys = [...new Set(points.flatMap((p) => Object.keys(p[field] || {})))].sort();
			return keys.map((k) => [k, points.map((p) => (p[field] || {})[k] || 0)]);
		};
		const delay = (q) => points.map((p) => (p.delay_ms && p.delay_ms.count > 0 ? p.delay_ms[q] : null));
		const specs = [
			['received', 'Pingbacks received per minute, by result', byKey('received'), ''],
			['deliveries', 'Deliveries per minute, by outcome', byKey('deliveries'), ''],
			['backlog', 'Backlog by state', byKey('backlog'), ''],
			['delay', 'Delivery delay (received to delivered), ms', [['p50', delay('p50')], ['p95', delay('p95')]], 'ms'],
		];
		const width = Math.max(260, Math.min(charts.clientWidth || main.clientWidth || 600, 1000));
		for (const [name, title, series, unit] of specs) {
			const box = el('div', {class: 'chart', 'data-chart': name}, el('h3', null, title));
			charts.append(box);
			if (series.length === 0) box.append(msg('No data in this range.', 'muted'));
			const opts = {
				width, height: 170,
				series: [{}, ...series.map(([label], i) => ({label, stroke: SERIES_COLORS[label] || PALETTE[i % PALETTE.length], width: 1.5,
					value: (u, v) => (v === null || v === undefined ? '—' : v + (unit ? ' ' + unit : ''))}))],
				axes: [{}, {size: axisFit}],
				scales: {x: {time: true}},
			};
			box.plot = new uPlot(opts, [xs, ...series.map(([, ys]) => ys)], box);
		}
	}

	// axisFit is a y axis' width (uPlot's axis size callback): its widest
	// label, its ticks and its gap, so that no label (a delay of 40,000 ms)
	// is cut at the page's edge.
	function axisFit(u, values, axisIdx, cycle) {
		const a = u.axes[axisIdx];
		if (cycle > 1) return a._size;
		u.ctx.font = a.font[0];
		const widest = Math.max(0, ...(values || []).map((v) => u.ctx.measureText(v).width / devicePixelRatio));
		return Math.max(40, Math.ceil(widest + a.ticks.size + a.gap + 2));
	}

	// SERIES_COLORS keeps a meaning's colour from chart to chart: what went
	// well green, what needs a person red, what waits amber.
	const SERIES_COLORS = {
		stored: '#1a7f37', poll_stored: '#2da44e', delivered: '#1a7f37', duplicate: '#6e7781',
		quarantined: '#8250df', parked: '#cf222e', rejected: '#a40e26', failed: '#d4a72c', timeout: '#bc4c00',
		interrupted: '#bf3989', expired: '#57606a', queued: '#0b61c4', forwarding: '#1b7c83', p50: '#0b61c4', p95: '#cf222e',
	};
	const PALETTE = ['#1a7f37', '#cf222e', '#0b61c4', '#9a6700', '#8250df', '#bf3989', '#1b7c83', '#6e7781'];

	// accountList shows a provider's accounts (status' accounts.<provider>:
	// account id → {key, used, left, pending, unpollable}), sorted by id:
	// each with its api_key entry (never the key; "not in api_key" for an
	// account this Caddy has no key for), its pending tasks (a link to
	// them), its unpollable tasks when there are any, and its budget. None
	// when the provider has no account (or the Caddy is older).
	function accountList(provider, accounts) {
		const ids = Object.keys(accounts || {}).sort();
		if (ids.length === 0) return [];
		const list = el('div', {class: 'accounts'});
		for (const id of ids) {
			const a = accounts[id] || {};
			list.append(el('section', {class: 'account', 'data-account': id},
				el('h4', null, 'account ', el('code', null, id), ' ',
					el('span', {class: a.api_key_entry ? 'muted' : 'nonzero state-expired'}, a.api_key_entry || 'not in api_key')),
				kv([
					['pending', navLink({view: 'tasks', provider, account: id, state: 'pending'}, String(a.pending || 0))],
					['unpollable', a.unpollable > 0 ? el('span', {class: 'nonzero state-expired'}, String(a.unpollable)) : undefined],
					['budget', 'used ' + (a.used || 0) + ', left ' + (a.left || 0)],
				])));
		}
		return list;
	}

	// heldRoutes shows the routes whose replays are held back (status'
	// routes: route → {paused_until, concurrency, max}), sorted: until when
	// they are paused and their replay concurrency of max: the nodes to
	// add, none when no route is held back.
	function heldRoutes(routes) {
		const names = Object.keys(routes || {}).sort();
		if (names.length === 0) return [];
		const card = el('div', {class: 'card', id: 'routes'});
		for (const name of names) {
			const r = routes[name] || {};
			card.append(el('section', {class: 'route', 'data-route': name},
				el('h3', null, name),
				kv([
					['paused until', isTime(r.paused_until) ? when(r.paused_until) : 'not paused'],
					['replay concurrency', typeof r.concurrency === 'number' && typeof r.max === 'number' ? r.concurrency + ' of ' + r.max : undefined],
				])));
		}
		return [el('h2', null, 'Routes held back'),
			el('p', {class: 'muted'}, 'The app answered 429, or 503 with Retry-After: replays of these routes are paused, or fewer run at once.'),
			card];
	}

	function formatBytes(n) {
		const units = ['B', 'kB', 'MB', 'GB', 'TB'];
		let i = 0;
		while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
		return n.toFixed(i ? 1 : 0) + ' ' + units[i];
	}

	// ---- results (the dead-letter queue by state) ----

	function recordFilter(q) {
		return {
			provider: q.get('provider') || '', state: q.get('state') || '',
			received_after: q.get('received_after') || '', received_before: q.get('received_before') || '',
		};
	}

	function filterForm(view, f, states, extra) {
		const stateSel = el('select', {name: 'state'}, el('option', {value: ''}, 'any'),
			states.map((s) => el('option', {value: s, selected: s === f.state}, s)));
		const prov = el('input', {name: 'provider', value: f.provider, placeholder: 'any', size: 12, autocapitalize: 'off'});
		const form = el('form', {class: 'filters'},
			el('label', null, 'state', stateSel), el('label', null, 'provider', prov), extra || [],
			el('button', {type: 'submit'}, 'Filter'));
		form.addEventListener('submit', (ev) => {
			ev.preventDefault();
			const params = {view};
			for (const [k, v] of new FormData(form)) params[k] = String(v).trim();
			// A date-time picker's local time goes into the link as RFC 3339.
			for (const input of form.querySelectorAll('input[type="datetime-local"]')) params[input.name] = fromLocalInput(input.value);
			go(params);
		});
		return form;
	}

	async function records(gen, q) {
		const f = recordFilter(q);
		const title = f.state === 'parked' || f.state === 'failed' || f.state === 'rejected' ? 'Dead letters: ' + f.state :
			f.state === 'quarantined' ? 'Quarantine' : 'Results';
		// The received-time filter shows once the list answers in the paged
		// shape ({"records", "next_cursor"}), which filters by it; a bare
		// array (an older admin API) does not.
		const ranged = !!(f.received_after || f.received_before);
		const range = [
			el('label', {class: 'range', hidden: !ranged}, 'received after',
				el('input', {name: 'received_after', type: 'datetime-local', step: 1, value: toLocalInput(f.received_after)})),
			el('label', {class: 'range', hidden: !ranged}, 'received before',
				el('input', {name: 'received_before', type: 'datetime-local', step: 1, value: toLocalInput(f.received_before)})),
		];
		const list = el('div', {id: 'records'});
		const bulk = el('div', {id: 'bulk'});
		main.replaceChildren(el('h1', null, title), filterForm('records', f, STATES, range), bulk, list);
		bulkActions(gen, f, bulk);
		await recordPage(gen, f, list);
	}

	// listPage appends one page of a list route (records or tasks) to list,
	// with a "More" button while the answer has a next_cursor. first is
	// called with the first page's answer.
	async function listPage(gen, route, f, cursor, list, card, empty, first) {
		const q = new URLSearchParams({limit: String(PAGE)});
		for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
		if (cursor) q.set('cursor', cursor);
		const r = await api('GET', route + '?' + q);
		if (gen !== generation) return;
		if (!r.ok) {
			list.append(msg(errorOf(r), 'error'));
			return;
		}
		const {items, next} = listOf(r.data, route);
		if (!cursor && first) first(r.data);
		if (items.length === 0 && !cursor) list.append(msg(empty, 'muted'));
		for (const item of items) list.append(card(item));
		if (next) {
			const more = el('button', {id: 'more'}, 'More');
			more.addEventListener('click', () => { more.remove(); listPage(gen, route, f, next, list, card, empty); });
			list.append(more);
		}
	}

	function recordPage(gen, f, list) {
		return listPage(gen, 'records', f, '', list, recordCard, 'No stored result matches.', (data) => {
			if (!Array.isArray(data)) {
				for (const label of main.querySelectorAll('label.range')) label.hidden = false;
			} else if (f.received_after || f.received_before) {
				list.append(msg('This admin API lists results without the received-time filter; Replay all applies it.', 'error'));
			}
		});
	}

	function recordCard(rec) {
		const card = el('article', {class: 'card', 'data-key': rec.provider + ':' + rec.id});
		fillRecordCard(card, rec);
		return card;
	}

	function fillRecordCard(card, rec) {
		const out = el('div', {class: 'msg'});
		card.replaceChildren(
			el('div', {class: 'rec-head'},
				navLink({view: 'record', provider: rec.provider, id: rec.id}, rec.provider + ' / ' + rec.id),
				stateBadge(rec.state)),
			kv([
				['received', when(rec.received_at)],
				['attempts', String(rec.attempts || 0)],
				['last status', rec.last_status ? String(rec.last_status) : undefined],
				['last error', rec.last_error],
				...lifePairs(rec),
				['quarantine', rec.state === 'quarantined' ? rec.quarantine || '?' : undefined],
			]),
			el('div', {class: 'actions'}, actionButton(rec, out, (updated) => fillRecordCard(card, updated))),
			out);
	}

	// lastFailure is the attempt of rec's history that last failed (not
	// delivered, ended), or undefined.
	function lastFailure(rec) {
		const h = Array.isArray(rec.history) ? rec.history : [];
		for (let i = h.length - 1; i >= 0; i--) {
			if (h[i].outcome && h[i].outcome !== 'delivered') return h[i];
		}
		return undefined;
	}

	// lifePairs are what a card says of a result's life beyond its
	// delivery counts: when it failed last and when it parked (from its
	// attempts), whether a pause holds it, whether its payload was erased,
	// and why it expired.
	function lifePairs(rec) {
		const f = lastFailure(rec);
		const failedAt = f ? (isTime(f.ended_at) ? f.ended_at : f.started_at) : undefined;
		const parkedAt = rec.state === 'parked' ? (failedAt || rec.updated_at) : undefined;
		return [
			['failed last', failedAt ? el('span', {'data-field': 'failed-last'}, when(failedAt)) : undefined],
			['parked', parkedAt ? el('span', {'data-field': 'parked-at'}, when(parkedAt)) : undefined],
			['held', rec.held ? el('span', {class: 'nonzero state-failed', 'data-field': 'held'}, 'yes: its provider is paused') : undefined],
			['payload', rec.payload_erased ? el('span', {'data-field': 'payload-erased'}, 'erased (kept: key, state, times, attempts)') : undefined],
			['expired', rec.expired_reason ? el('span', {class: 'nonzero state-expired', 'data-field': 'expired-reason'}, rec.expired_reason) : undefined],
		];
	}

	// actionButton is Release for a quarantined result (replay refuses
	// one), else Replay; done gets the record after the attempt.
	function actionButton(rec, out, done) {
		return rec.state === 'quarantined' ? releaseButton(rec, out, done) : replayButton(rec, out, done);
	}

	// releaseButton delivers a quarantined result by hand, after a
	// confirmation: the result failed verification (it may be a forgery,
	// which the app would then take as the provider's answer), and a
	// delivery cannot be taken back.
	function releaseButton(rec, out, done) {
		const b = el('button', {class: 'primary', 'data-action': 'release'}, 'Release…');
		b.addEventListener('click', () => {
			out.replaceChildren(confirmBox('Deliver ' + rec.provider + ' / ' + rec.id + ' to the app? It is quarantined (' +
				(rec.quarantine || 'no reason recorded') + '): nothing shows that it is the provider\'s result.', 'Release',
			async (box) => {
				const r = await api('POST', 'records/' + keyPath(rec.provider, rec.id) + '/release');
				if (r.ok) {
					done(r.data, 'Released');
					return;
				}
				box.replaceChildren(msg(errorOf(r), 'error'));
			}));
		});
		return b;
	}

	// replayButton replays one result at once (no confirmation); a delivered
	// one answers 409, after which "Replay anyway" forces it.
	function replayButton(rec, out, done) {
		const b = el('button', {class: 'primary', 'data-action': 'replay'}, 'Replay');
		b.addEventListener('click', async () => {
			b.disabled = true;
			b.textContent = 'Replaying…';
			await replay(rec, false, out, done, b);
		});
		return b;
	}

	async function replay(rec, force, out, done, b) {
		const r = await api('POST', 'records/' + keyPath(rec.provider, rec.id) + '/replay' + (force ? '?force=true' : ''));
		if (r.ok) {
			done(r.data, 'Replayed');
			return;
		}
		b.disabled = false;
		b.textContent = 'Replay';
		out.replaceChildren(el('span', {class: 'error'}, errorOf(r)));
		if (r.status === 409 && /delivered/.test(errorOf(r))) {
			const f = el('button', {class: 'danger', 'data-action': 'force-replay'}, 'Replay anyway');
			f.addEventListener('click', async () => {
				f.disabled = true;
				await replay(rec, true, out, done, f);
			});
			out.append(' ', f);
		}
	}

	function filterText(f) {
		const parts = [];
		parts.push(f.state ? 'every ' + f.state + ' result' : 'every result');
		if (f.provider) parts.push('of ' + f.provider);
		if (f.received_after) parts.push('received after ' + f.received_after);
		if (f.received_before) parts.push('received before ' + f.received_before);
		return parts.join(' ');
	}

	function bulkActions(gen, f, bulk) {
		const bar = el('div', {class: 'actions'});
		const area = el('div');
		bulk.replaceChildren(bar, area);
		const state = f.state || 'parked';
		// Bulk replay refuses delivered, forwarding and quarantined results
		// (quarantined ones are released one by one).
		if (state !== 'delivered' && state !== 'forwarding' && state !== 'quarantined') {
			const b = el('button', {id: 'bulk-replay'}, 'Replay all ' + state + '…');
			b.addEventListener('click', () => {
				const filter = {...f, state};
				area.replaceChildren(confirmBox('Replay ' + filterText(filter) + ' now?', 'Replay all',
					(box) => startBulk(gen, filter, box, f)));
			});
			bar.append(b);
		}
		probePurge().then((ok) => {
			if (!ok || gen !== generation) return;
			const hasFilter = f.provider || f.state || f.received_after || f.received_before;
			if (!hasFilter) return; // POST /pingback/purges needs a filter
			const p = el('button', {id: 'bulk-purge', class: 'danger'}, 'Purge all matching…');
			p.addEventListener('click', () => {
				area.replaceChildren(confirmBox('Erase ' + filterText(f) + ' from the store? This cannot be undone.', 'Purge',
					async (box) => {
						const body = {};
						for (const [k, v] of Object.entries(f)) if (v) body[k] = v;
						const r = await api('POST', 'purges', body);
						box.replaceChildren(r.ok ? msg('Purged ' + (r.data ? r.data.purged : 0) + ' results.', 'ok') : msg(errorOf(r), 'error'));
						if (r.ok) refreshList(gen, f);
					}));
			});
			bar.append(p);
		});
	}

	function refreshList(gen, f) {
		const list = document.getElementById('records');
		if (!list || gen !== generation) return;
		list.replaceChildren();
		recordPage(gen, f, list);
	}

	async function startBulk(gen, filter, box, listed) {
		const body = {};
		for (const [k, v] of Object.entries(filter)) if (v) body[k] = v;
		const r = await api('POST', 'replays', body);
		if (!r.ok) {
			box.replaceChildren(msg(errorOf(r), 'error'));
			return;
		}
		const bar = el('progress', {max: 1, value: 0});
		const line = el('p', {class: 'msg', id: 'bulk-progress'});
		const cancel = el('button', {'data-action': 'cancel-bulk'}, 'Cancel');
		box.replaceChildren(bar, line, el('div', {class: 'actions'}, cancel));
		const show = (job) => {
			bar.max = Math.max(job.matched || 0, 1);
			bar.value = job.done || 0;
			line.textContent = 'Bulk replay ' + job.id + ': ' + job.status + ', ' + (job.done || 0) + '/' + (job.matched || 0) +
				' done, ' + (job.delivered || 0) + ' delivered, ' + (job.failed || 0) + ' failed';
			line.dataset.status = job.status;
		};
		show(r.data);
		cancel.addEventListener('click', async () => {
			const c = await api('DELETE', 'replays/' + encodeURIComponent(r.data.id));
			if (c.ok) show(c.data);
		});
		let job = r.data;
		while (job.status === 'running') {
			await new Promise((res) => setTimeout(res, 500));
			if (gen !== generation) return;
			const g = await api('GET', 'replays/' + encodeURIComponent(job.id));
			if (!g.ok) {
				line.after(msg(errorOf(g), 'error'));
				return;
			}
			job = g.data;
			show(job);
		}
		cancel.remove();
		refreshList(gen, listed);
	}

	// ---- one result ----

	async function record(gen, q) {
		const provider = q.get('provider') || '', id = q.get('id') || '';
		const r = await api('GET', 'records/' + keyPath(provider, id));
		if (gen !== generation) return;
		const head = el('h1', null, provider + ' / ' + id);
		if (!r.ok) {
			main.replaceChildren(head, msg(errorOf(r), 'error'));
			return;
		}
		main.replaceChildren(head, recordDetail(gen, r.data));
	}

	function recordDetail(gen, rec) {
		const wrap = el('div', {id: 'record', 'data-key': rec.provider + ':' + rec.id});
		const out = el('div', {class: 'msg'});
		const actions = el('div', {class: 'actions'}, actionButton(rec, out, (updated, what) => {
			const fresh = recordDetail(gen, updated);
			wrap.replaceWith(fresh);
			fresh.querySelector('.msg').replaceChildren(msg(what + ': ' + updated.state + '.', 'ok'));
		}));
		probePurge().then((ok) => {
			if (!ok || gen !== generation) return;
			const p = el('button', {class: 'danger', 'data-action': 'purge'}, 'Purge…');
			p.addEventListener('click', () => {
				out.replaceChildren(confirmBox('Erase ' + rec.provider + ' / ' + rec.id + ' from the store? This cannot be undone.', 'Purge',
					async (box) => {
						const r = await api('DELETE', 'records/' + keyPath(rec.provider, rec.id));
						box.replaceChildren(r.ok ? msg('Purged.', 'ok') : msg(errorOf(r), 'error'));
						if (r.ok) actions.remove();
					}));
			});
			actions.append(p);
		});
		const req = rec.request || {};
		const d = rec.lease || {};
		wrap.append(...[
			el('div', {class: 'rec-head'}, stateBadge(rec.state), el('span', {class: 'muted'}, 'source ' + (rec.source || '?'))),
			actions, out,
			el('section', {class: 'card'}, kv([
				['received', when(rec.received_at)],
				['submitted', isTime(rec.submitted_at) ? when(rec.submitted_at) : undefined],
				['attempts', String(rec.attempts || 0)],
				['failures', String(rec.failures || 0)],
				['interrupts', rec.interrupts ? String(rec.interrupts) : undefined],
				['last status', rec.last_status ? String(rec.last_status) : undefined],
				['last error', rec.last_error],
				['next replay', isTime(rec.due_at) ? when(rec.due_at) : undefined],
				['lease', d.owner ? d.owner + ' until ' + d.until : undefined],
				['updated', when(rec.updated_at)],
				['expires', when(rec.expires_at)],
				['server', rec.server],
				['verified', rec.verified],
				['tracked', rec.tracked === undefined ? undefined : (rec.tracked ? 'yes' : 'no')],
				['quarantine', rec.quarantine],
				['correction', rec.correction ? 'yes: the app was sent another code first' : undefined],
				...lifePairs(rec),
			])),
			el('h2', null, 'Result'),
			el('pre', {id: 'code'}, rec.code || ''),
			rec.other_code ? [el('h2', null, 'Other code (lost)'), el('pre', {id: 'other-code'}, rec.other_code)] : [],
			rec.answer ? [el('h2', null, 'Answer'), el('pre', {id: 'answer'}, bytesText(rec.answer))] : [],
			el('h2', null, 'Request'),
			requestCard(req),
			historySection(rec.history),
		].flat());
		return wrap;
	}

	function requestCard(req) {
		const headers = req.header || {};
		const names = Object.keys(headers).sort();
		const hdrs = el('dl', {class: 'kv', id: 'headers'});
		for (const n of names) {
			for (const v of [].concat(headers[n])) hdrs.append(el('dt', null, n), el('dd', null, String(v)));
		}
		return el('section', {class: 'card'},
			kv([
				['request', (req.method || '') + ' ' + (req.uri || '')],
				['host', req.host],
				['from', req.remote_addr],
				['protocol', [req.proto, req.tls ? 'TLS' : ''].filter(Boolean).join(', ')],
			]),
			names.length ? [el('h3', null, 'Headers'), hdrs] : [],
			req.body ? [el('h3', null, 'Body'), el('pre', {id: 'body'}, bytesText(req.body))] : []);
	}

	// historySection renders the record's attempt history when the admin
	// API answers it (history: [{attempt, source, started_at, ended_at,
	// status, outcome, error}]).
	function historySection(history) {
		if (!Array.isArray(history)) return [];
		const head = el('h2', null, 'Attempts');
		if (history.length === 0) return [head, msg('No forward yet.', 'muted')];
		const cols = ['attempt', 'source', 'started', 'took', 'status', 'outcome', 'error'];
		const tbody = el('tbody');
		for (const h of history) {
			const took = isTime(h.started_at) && isTime(h.ended_at) ? ((new Date(h.ended_at) - new Date(h.started_at)) / 1000).toFixed(3) + 's' : '';
			const vals = [h.attempt, h.source, when(h.started_at), took, h.status ? String(h.status) : '—', h.outcome ? stateBadge(h.outcome) : '', h.error || ''];
			tbody.append(el('tr', null, vals.map((v, i) => el('td', {'data-label': cols[i]}, v === undefined || v === '' ? null : v))));
		}
		return [head, el('table', {class: 'history', id: 'history'},
			el('thead', null, el('tr', null, cols.map((c) => el('th', null, c)))), tbody)];
	}

	// ---- tasks ----

	async function tasks(gen, q) {
		const f = {provider: q.get('provider') || '', state: q.get('state') || '', account: q.get('account') || ''};
		const list = el('div', {id: 'tasks'});
		const account = el('label', null, 'account',
			el('input', {name: 'account', value: f.account, placeholder: 'any', size: 16, autocapitalize: 'off', spellcheck: 'false'}));
		main.replaceChildren(el('h1', null, 'Tasks' + (f.state ? ': ' + f.state : '')), filterForm('tasks', f, TASK_STATES, account), list);
		await listPage(gen, 'tasks', f, '', list, taskCard, 'No tracked task matches.');
	}

	function taskCard(t) {
		return el('article', {class: 'card', 'data-key': t.provider + ':' + t.id, 'data-account': t.account || null},
			el('div', {class: 'rec-head'}, el('strong', null, t.provider + ' / ' + t.id), stateBadge(t.state),
				isTime(t.result_at) ? navLink({view: 'record', provider: t.provider, id: t.id}, 'result') : null),
			kv([
				['account', t.account ? navLink({view: 'tasks', provider: t.provider, account: t.account}, t.account) : undefined],
				['submitted', when(t.submitted_at)],
				['method', t.method],
				['next poll', isTime(t.next_poll_at) ? when(t.next_poll_at) : undefined],
				['polls', t.polls ? String(t.polls) : undefined],
				['result', isTime(t.result_at) ? when(t.result_at) : undefined],
				['last error', t.last_error],
				['pingback url', t.pingback_url],
			]));
	}

	// ---- search by task id ----

	// search looks the exact task id up (as the provider writes it) among
	// the stored results of every provider the plugin knows, whatever
	// their state, and among the tracked tasks.
	async function search(gen, q) {
		const id = (q.get('id') || '').trim();
		const list = el('div', {id: 'found'});
		main.replaceChildren(el('h1', null, 'Task ' + id), list);
		searchBox().elements.id.value = id;
		if (!id) {
			list.append(msg('Type a task id in the search box.', 'muted'));
			return;
		}
		const answers = await Promise.all(PROVIDERS.flatMap((p) => [
			api('GET', 'records/' + keyPath(p, id)).then((r) => ({kind: 'record', r})),
			api('GET', 'tasks/' + keyPath(p, id)).then((r) => ({kind: 'task', r})),
		]));
		if (gen !== generation) return;
		let found = 0;
		for (const {kind, r} of answers) {
			if (r.ok && r.data) {
				list.append(kind === 'record' ? recordCard(r.data) : taskCard(r.data));
				found++;
			} else if (r.status !== 404) {
				list.append(msg(errorOf(r), 'error'));
			}
		}
		if (found === 0) list.append(msg('No stored result or tracked task has the id ' + id + '.', 'muted'));
	}

	function searchBox() {
		return document.getElementById('search');
	}

	searchBox().addEventListener('submit', (ev) => {
		ev.preventDefault();
		const id = searchBox().elements.id.value.trim();
		if (id) go({view: 'search', id});
	});

	// ---- routing ----

	function render() {
		const gen = ++generation;
		const q = new URLSearchParams(location.search);
		let view = q.get('view');
		if (!view) view = q.has('state') || q.has('provider') ? 'records' : 'overview';
		document.body.dataset.view = view;
		const views = {overview, records, record, tasks, search};
		(views[view] || overview)(gen, q).catch((e) => main.replaceChildren(msg('The console failed: ' + e.message, 'error')));
	}

	document.addEventListener('click', (ev) => {
		const a = ev.target.closest('a[data-nav]');
		if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
		ev.preventDefault();
		history.pushState(null, '', a.getAttribute('href'));
		render();
	});
	window.addEventListener('popstate', render);
	render();
})();
