import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { api } from './api'

// Secrets lists the account's secrets (GET /v1/secrets) with how often
// the egress gateway injected each and when last: never a value (no
// answer of the API holds one).
export function Secrets() {
  const [rows, setRows] = useState<any[] | null>(null)
  const [err, setErr] = useState('')
  useEffect(() => {
    api('GET', '/v1/secrets').then((r) => setRows(r.secrets), (x) => setErr(x.message))
  }, [])
  return html`<section>
    <h2>Secrets</h2>
    ${err && html`<p class="error">${err}</p>`}
    ${rows === null ? !err && html`<p class="muted">Loading…</p>` : rows.length === 0 ? html`<p id="no-secrets" class="muted">No secrets (POST /v1/secrets).</p>` :
      html`<table id="secrets"><thead><tr><th>Name</th><th>Version</th><th>Uses</th><th>Last use</th><th>Updated</th></tr></thead>
      <tbody>${rows.map((s) => html`<tr key=${s.name}>
        <td><a href=${`#/secrets/${encodeURIComponent(s.name)}`}>${s.name}</a></td><td>${s.version}</td><td>${s.use_count}</td>
        <td>${s.last_used_at ? new Date(s.last_used_at).toLocaleString() : html`<span class="muted">never</span>`}</td>
        <td>${new Date(s.updated_at).toLocaleString()}</td>
      </tr>`)}</tbody></table>`}
  </section>`
}

// SecretUses is one secret's recent uses at the egress gateway (GET
// /v1/secrets/{name}/uses), newest first, 50 a page, older ones on
// demand: sandbox, host, method, path, time and outcome.
export function SecretUses({ name }: { name: string }) {
  const [info, setInfo] = useState<any>(null)
  const [uses, setUses] = useState<any[]>([])
  const [next, setNext] = useState('')
  const [err, setErr] = useState('')
  const page = (before: string) =>
    api('GET', `/v1/secrets/${encodeURIComponent(name)}/uses?limit=50${before ? `&before=${before}` : ''}`).then((r) => {
      setUses((l) => before ? [...l, ...r.uses] : r.uses)
      setNext(r.next ?? '')
    }, (x) => setErr(x.message))
  useEffect(() => {
    setUses([]); setNext(''); setErr('')
    api('GET', `/v1/secrets/${encodeURIComponent(name)}`).then(setInfo, (x) => setErr(x.message))
    page('')
  }, [name])
  return html`<section>
    <div class="bar"><h2>Secret ${name}</h2><a href="#/secrets">All secrets</a></div>
    ${err && html`<p class="error">${err}</p>`}
    ${info && html`<p id="secret-info" class="muted">version ${info.version}, ${info.use_count} uses, last ${info.last_used_at ? new Date(info.last_used_at).toLocaleString() : 'never'}</p>`}
    ${uses.length === 0 ? !err && html`<p id="no-uses" class="muted">No uses recorded.</p>` :
      html`<table id="secret-uses"><thead><tr><th>Time</th><th>Sandbox</th><th>Host</th><th>Method</th><th>Path</th><th>Outcome</th></tr></thead>
      <tbody>${uses.map((u) => html`<tr key=${u.id} class=${u.outcome === 'injected' ? '' : 'error'}>
        <td>${new Date(u.at).toLocaleString()}</td><td><a href=${`#/sandbox/${u.sandbox_id}`}>${u.sandbox_id}</a></td>
        <td>${u.host}</td><td>${u.method}</td><td>${u.path}</td><td>${u.outcome}</td>
      </tr>`)}</tbody></table>`}
    ${next && html`<button id="older-uses" onClick=${() => page(next)}>Older</button>`}
  </section>`
}
