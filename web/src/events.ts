import { html } from 'htm/preact'
import { useEffect, useState } from 'preact/hooks'
import { api, stream } from './api'
import { EventList } from './sandbox'

const kinds = ['security_violation', 'resource_exceeded']

// SecurityEvents lists the account's security and resource events, the
// stored ones first, then live ones as they happen.
export function SecurityEvents() {
  const [type, setType] = useState('security_violation')
  const [sandbox, setSandbox] = useState('')
  const [events, setEvents] = useState<any[]>([])
  const [err, setErr] = useState('')
  useEffect(() => {
    const ctl = new AbortController()
    const q = `type=${type}${sandbox ? `&sandbox=${encodeURIComponent(sandbox)}` : ''}`
    let list: any[] = []
    api('GET', `/v1/events?${q}&limit=1000`).then((page) => {
      list = page.events.reverse()
      setEvents(list)
      setErr('')
      const last = page.events.length ? page.events[0].id : 0
      return stream(`/v1/events?${q}&cursor=${last}`, (e) => { list = [e.data, ...list].slice(0, 1000); setEvents(list) }, ctl.signal)
    }).catch((x) => { if (!ctl.signal.aborted) setErr(x.message) })
    return () => ctl.abort()
  }, [type, sandbox])
  return html`<section id="security">
    <h2>Security events</h2>
    <div class="bar">
      <select value=${type} onChange=${(e: any) => setType(e.target.value)}>${kinds.map(k => html`<option value=${k}>${k}</option>`)}</select>
      <input placeholder="sandbox id" value=${sandbox} onChange=${(e: any) => setSandbox(e.target.value.trim())} />
    </div>
    ${err && html`<p class="error">${err}</p>`}
    <div class="panel">${events.length ? html`<${EventList} events=${events} />` : html`<p class="muted">None.</p>`}</div>
  </section>`
}
