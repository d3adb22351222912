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
		return el('time', {datetime: t, title: iso}, iso + ' (' + ago((Date.now() - d.getTime()) / 1000) + ')');
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

	async function overview(gen) {
		const r = await api('GET', 'status');
		if (gen !== generation) return;
		const out = [el('h1', null, 'Overview')];
		if (!r.ok) {
			main.replaceChildren(...out, msg(errorOf(r), 'error'));
			return;
		}
		const s = r.data || {};
		const records = s.records || {};
		const tasks = s.tasks || {};
		const providers = [...new Set([...Object.keys(records), ...Object.keys(tasks), ...Object.keys(s.last_callback_at || {})])].sort();
		if (providers.length === 0) out.push(msg('Nothing stored yet.', 'muted'));
		const grid = el('div', {class: 'grid'});
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
				]),
				accountList(p, (s.accounts || {})[p])));
		}
		out.push(grid);
		out.push(...heldRoutes(s.routes));
		const loops = s.loops || {};
		const loopPairs = Object.keys(loops).sort().map((l) => [l + ' loop', when(loops[l].last_run_at)]);
		const st = s.store || {};
		out.push(el('h2', null, 'Loops and store'), el('div', {class: 'card'}, kv([
			...loopPairs,
			['store', [st.kind, st.location].filter(Boolean).join(' ')],
			['available', st.available === undefined ? undefined : (st.available ? 'yes' : 'no')],
			['free space', typeof st.free_bytes === 'number' ? formatBytes(st.free_bytes) : undefined],
		])));
		main.replaceChildren(...out);
		setTimeout(() => { if (gen === generation) overview(gen); }, 5000);
	}

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
				el('input', {name: 'received_after', value: f.received_after, placeholder: 'RFC 3339', size: 20})),
			el('label', {class: 'range', hidden: !ranged}, 'received before',
				el('input', {name: 'received_before', value: f.received_before, placeholder: 'RFC 3339', size: 20})),
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
				['quarantine', rec.state === 'quarantined' ? rec.quarantine || '?' : undefined],
			]),
			el('div', {class: 'actions'}, actionButton(rec, out, (updated) => fillRecordCard(card, updated))),
			out);
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
				['payload', rec.payload_erased ? 'erased (keep_payload): code, body, headers and query are gone' : undefined],
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

	// ---- routing ----

	function render() {
		const gen = ++generation;
		const q = new URLSearchParams(location.search);
		let view = q.get('view');
		if (!view) view = q.has('state') || q.has('provider') ? 'records' : 'overview';
		document.body.dataset.view = view;
		const views = {overview, records, record, tasks};
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
