import { render } from 'preact'
import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { api, login, logout, setUnauthorizedHandler } from './api'
import { Sandboxes } from './sandboxes'
import { SandboxPage } from './sandbox'
import { Usage } from './usage'
import { SecurityEvents } from './events'
import { Metrics } from './metrics'
import { SecretUses, Secrets } from './secrets'
import './style.css'

function useHash(): string {
  const [hash, setHash] = useState(location.hash)
  useEffect(() => {
    const f = () => setHash(location.hash)
    addEventListener('hashchange', f)
    return () => removeEventListener('hashchange', f)
  }, [])
  return hash
}

function Login({ onDone }: { onDone: () => void }) {
  const [key, setKey] = useState('')
  const [err, setErr] = useState('')
  const submit = async (e: Event) => {
    e.preventDefault()
    setErr('')
    try {
      await login(key.trim())
      setKey('')
      onDone()
    } catch (x: any) {
      setErr(x.message)
    }
  }
  return html`<form class="login" onSubmit=${submit}>
    <h1>Sheepfold</h1>
    <label>API key <input id="key" type="password" autocomplete="off" value=${key}
      onInput=${(e: any) => setKey(e.target.value)} placeholder="sf_..." /></label>
    <button id="login" type="submit">Log in</button>
    ${err && html`<p class="error">${err}</p>`}
  </form>`
}

function App() {
  const [account, setAccount] = useState<any>(undefined)
  const hash = useHash()
  const load = () => api('GET', '/v1/account').then(setAccount, () => setAccount(null))
  useEffect(() => {
    setUnauthorizedHandler(() => setAccount(null))
    load()
  }, [])
  if (account === undefined) return html`<p class="muted">Loading…</p>`
  if (account === null) return html`<${Login} onDone=${load} />`
  const [, page, arg] = hash.replace(/^#/, '').split('/')
  let body
  switch (page) {
    case 'sandbox': body = html`<${SandboxPage} id=${decodeURIComponent(arg ?? '')} />`; break
    case 'usage': body = html`<${Usage} account=${account} />`; break
    case 'security': body = html`<${SecurityEvents} />`; break
    case 'metrics': body = html`<${Metrics} />`; break
    case 'secrets': body = arg ? html`<${SecretUses} name=${decodeURIComponent(arg)} />` : html`<${Secrets} />`; break
    default: body = html`<${Sandboxes} />`
  }
  const out = async () => { await logout().catch(() => {}); setAccount(null) }
  const active = (p: string) => (page ?? '') === p ? 'active' : ''
  return html`<header>
      <strong>Sheepfold</strong>
      <nav>
        <a class=${active('')} href="#/">Sandboxes</a>
        <a class=${active('usage')} href="#/usage">Usage</a>
        <a class=${active('security')} href="#/security">Security events</a>
        <a class=${active('metrics')} href="#/metrics">Metrics</a>
        <a class=${active('secrets')} href="#/secrets">Secrets</a>
      </nav>
      <span class="muted">${account.name ?? account.id}</span>
      <button class="link" onClick=${out}>Log out</button>
    </header>
    <main>${body}</main>`
}

render(html`<${App} />`, document.getElementById('app')!)
